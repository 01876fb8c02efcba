"""The zoo's sequence models (BERT-base, MobileBERT) as ONNX graphs with random weights.

Both take hidden states ``[batch, seq, hidden]`` (no embedding) and share the attention
block: heads split by reshape + transpose, scaled dot products, softmax, heads merged.
"""

from __future__ import annotations

import onnx

from stormdrop.workloads._onnx_builder import GraphBuilder


class _Heads:
    """Splits ``[B, S, heads * dh]`` projections into heads and merges them back, for one graph."""

    def __init__(self, g: GraphBuilder, batch: int, seq: int, heads: int, dh: int) -> None:
        self.g, self.shape = g, (batch, seq, heads, dh)
        self.scale = g.const(1.0 / dh**0.5)

    def split(self, t: str) -> str:  # [B, S, H] -> [B, heads, S, dh]
        return self.g.transpose(self.g.reshape(t, self.shape), (0, 2, 1, 3))

    def split_keys(self, t: str) -> str:  # [B, S, H] -> [B, heads, dh, S]
        return self.g.transpose(self.g.reshape(t, self.shape), (0, 2, 3, 1))

    def attend(self, q: str, kt: str, v: str) -> str:
        """softmax(q kᵀ / sqrt(dh)) v, heads merged back: [B, S, heads * dh]."""
        g = self.g
        batch, seq, heads, dh = self.shape
        probs = g.softmax(g.mul(g.matmul(q, kt), self.scale), axis=-1)
        return g.reshape(g.transpose(g.matmul(probs, v), (0, 2, 1, 3)), (batch, seq, heads * dh))


def bert_base(batch: int, seq: int, seed: int, *, layers: int = 12) -> onnx.ModelProto:
    """BERT-base encoder: post-LN layers of 12-head self-attention + GELU FFN (3072)."""
    hidden, heads, ffn = 768, 12, 3072
    g = GraphBuilder("bert_base", seed)
    x = g.input("input", (batch, seq, hidden))
    h = _Heads(g, batch, seq, heads, hidden // heads)
    for _ in range(layers):
        q = h.split(g.linear(x, hidden, gain=0.7))
        kt = h.split_keys(g.linear(x, hidden, gain=0.7))
        v = h.split(g.linear(x, hidden, gain=0.7))
        ctx = h.attend(q, kt, v)
        x = g.layernorm(g.add(g.linear(ctx, hidden, gain=0.7), x), eps=1e-12)
        f = g.gelu(g.linear(x, ffn))
        x = g.layernorm(g.add(g.linear(f, hidden, gain=0.7), x), eps=1e-12)
    g.output(x)
    return g.model()


def mobilebert(batch: int, seq: int, seed: int, *, layers: int = 24) -> onnx.ModelProto:
    """MobileBERT encoder (Sun et al. 2020; Hugging Face's MobileBertLayer): hidden 512, bottleneck
    128, 4 heads, NoNorm, ReLU, four stacked FFNs; Q and K share one bottleneck of the hidden
    state, V reads the 512-wide hidden state itself.

    NoNorm does not normalize, so with random weights every residual branch ends in a small
    gain (0.3 inside a layer, 0.1 for the output bottleneck back onto the 512-wide stream):
    with torch-like gains the hidden states grew ~7x a layer and were all NaN by layer 24."""
    hidden, inner, heads, ffn = 512, 128, 4, 512
    g = GraphBuilder("mobilebert", seed)
    x = g.input("input", (batch, seq, hidden))
    h = _Heads(g, batch, seq, heads, inner // heads)
    for _ in range(layers):
        layer_input = g.nonorm(g.linear(x, inner, gain=0.7))  # input bottleneck
        shared = g.nonorm(g.linear(x, inner, gain=0.7))  # Q/K's shared bottleneck
        q = h.split(g.linear(shared, inner, gain=0.7))
        kt = h.split_keys(g.linear(shared, inner, gain=0.7))
        v = h.split(g.linear(x, inner, gain=0.7))
        ctx = h.attend(q, kt, v)
        t = g.nonorm(g.add(g.linear(ctx, inner, gain=0.3), layer_input))
        for _ in range(4):  # three extra FFNs, then the layer's own
            f = g.linear(g.relu(g.linear(t, ffn)), inner, gain=0.3)
            t = g.nonorm(g.add(f, t))
        x = g.nonorm(g.add(g.linear(t, hidden, gain=0.1), x))  # output bottleneck back to 512
    g.output(x)
    return g.model()
