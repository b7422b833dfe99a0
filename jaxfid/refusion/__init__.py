"""ReFusion (Wu et al., ICLR 2024): retrieved sentence vectors fused into
chosen T5 projections, a bi-level search choosing each module's scheme."""
