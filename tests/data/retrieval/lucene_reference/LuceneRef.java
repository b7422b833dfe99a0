// Reference outputs from Apache Lucene, used to check jaxfid's BM25 and analyzer.
//
// Not run by the tests: it generated the fixture files beside it, which the
// tests compare against. Needs Lucene 8 (lucene-core, lucene-analyzers-common);
// on Debian: apt-get install liblucene8-java, then
//   javac -cp "/usr/share/java/*" LuceneRef.java
//   java -cp "/usr/share/java/*:." LuceneRef analyze < words.txt > tokens.txt
//   java -cp "/usr/share/java/*:." LuceneRef bm25 CORPUS.tsv QUERIES.tsv K K1 B > run.trec
// CORPUS.tsv: "id<TAB>contents" lines; QUERIES.tsv: "qid<TAB>text" lines.
// Analysis is EnglishAnalyzer (StandardTokenizer, EnglishPossessiveFilter,
// LowerCaseFilter, StopFilter(ENGLISH_STOP_WORDS_SET), PorterStemFilter), the
// chain of Anserini's DefaultEnglishAnalyzer; queries are bags of words (one
// TermQuery per distinct term, boosted by its count) as in Anserini, and ties
// are broken by docid, as Anserini does.
import java.io.*;
import java.nio.charset.StandardCharsets;
import java.util.*;
import org.apache.lucene.analysis.Analyzer;
import org.apache.lucene.analysis.TokenStream;
import org.apache.lucene.analysis.en.EnglishAnalyzer;
import org.apache.lucene.analysis.tokenattributes.CharTermAttribute;
import org.apache.lucene.document.*;
import org.apache.lucene.index.*;
import org.apache.lucene.search.*;
import org.apache.lucene.search.similarities.BM25Similarity;
import org.apache.lucene.store.ByteBuffersDirectory;
import org.apache.lucene.util.BytesRef;

public class LuceneRef {
  static List<String> analyze(Analyzer a, String text) throws IOException {
    List<String> out = new ArrayList<>();
    try (TokenStream ts = a.tokenStream("contents", text)) {
      CharTermAttribute term = ts.addAttribute(CharTermAttribute.class);
      ts.reset();
      while (ts.incrementToken()) out.add(term.toString());
      ts.end();
    }
    return out;
  }

  static BufferedReader reader(String path) throws IOException {
    return new BufferedReader(new InputStreamReader(new FileInputStream(path), StandardCharsets.UTF_8));
  }

  public static void main(String[] args) throws Exception {
    Analyzer analyzer = new EnglishAnalyzer();
    PrintStream out = new PrintStream(new FileOutputStream(FileDescriptor.out), true, "UTF-8");
    if (args[0].equals("analyze")) {
      BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
      String line;
      while ((line = in.readLine()) != null) out.println(String.join(" ", analyze(analyzer, line)));
      return;
    }
    String corpus = args[1], queries = args[2];
    int k = Integer.parseInt(args[3]);
    float k1 = Float.parseFloat(args[4]), b = Float.parseFloat(args[5]);
    BM25Similarity sim = new BM25Similarity(k1, b);
    ByteBuffersDirectory dir = new ByteBuffersDirectory();
    IndexWriterConfig config = new IndexWriterConfig(analyzer).setSimilarity(sim);
    try (IndexWriter writer = new IndexWriter(dir, config); BufferedReader in = reader(corpus)) {
      String line;
      while ((line = in.readLine()) != null) {
        int tab = line.indexOf('\t');
        Document doc = new Document();
        String id = line.substring(0, tab);
        doc.add(new StringField("id", id, Field.Store.YES));
        doc.add(new SortedDocValuesField("id", new BytesRef(id)));
        doc.add(new TextField("contents", line.substring(tab + 1), Field.Store.NO));
        writer.addDocument(doc);
      }
      writer.forceMerge(1);
    }
    IndexSearcher searcher = new IndexSearcher(DirectoryReader.open(dir));
    searcher.setSimilarity(sim);
    Sort sort = new Sort(SortField.FIELD_SCORE, new SortField("id", SortField.Type.STRING));
    try (BufferedReader in = reader(queries)) {
      String line;
      while ((line = in.readLine()) != null) {
        int tab = line.indexOf('\t');
        String qid = line.substring(0, tab);
        Map<String, Integer> counts = new LinkedHashMap<>();
        for (String t : analyze(analyzer, line.substring(tab + 1))) counts.merge(t, 1, Integer::sum);
        BooleanQuery.Builder builder = new BooleanQuery.Builder();
        for (Map.Entry<String, Integer> e : counts.entrySet()) {
          Query q = new TermQuery(new Term("contents", e.getKey()));
          builder.add(new BoostQuery(q, (float) e.getValue()), BooleanClause.Occur.SHOULD);
        }
        TopDocs top = searcher.search(builder.build(), k, sort, true);
        int rank = 1;
        for (ScoreDoc sd : top.scoreDocs) {
          String id = searcher.doc(sd.doc).get("id");
          out.println(qid + " Q0 " + id + " " + rank++ + " " + sd.score + " lucene");
        }
      }
    }
  }
}
