"""The reader every method builds on: T5 reading a question's passages.

FiD's data formats and inputs (:mod:`.examples`, :mod:`.inputs`), batches
(:mod:`.batches`), the reader config and decoding settings (:mod:`.config`),
the training task (:mod:`.task`), prediction and QA evaluation
(:mod:`.predict`), a checkpoint loaded for answering (:mod:`.load`), its
``jaxfid eval`` evaluator (:mod:`.checkpoint_eval`) and cross-attention
passage scores (:mod:`.attention`).
"""
