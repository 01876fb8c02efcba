"""How a model is lowered before its kernels are tuned: layout, fast math, Winograd, padded rows and
attentions, tiled reductions, prepacked weights."""
