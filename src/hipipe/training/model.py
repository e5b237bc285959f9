"""A small decoder-only transformer language model, sized by its gradient bytes.

The training benchmark needs a model whose gradients weigh what the user asks for
(``--model-mib``), whose compute per step stays small on a 2-core host (so the network,
not the CPU, dominates the step), and that FSDP2 can shard block by block. A stack of
identical pre-norm blocks over byte tokens does all three: the width is solved from the
byte budget, and each block is one ``fully_shard`` unit.
"""

import math
from dataclasses import dataclass

import torch
from torch import nn

VOCAB_SIZE = 256
"""Byte-level tokens: no tokenizer to download, any seed gives valid data."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    """Shape of :class:`TinyLM`; :func:`config_for_bytes` picks one from a size."""

    width: int
    num_layers: int
    num_heads: int
    context_tokens: int
    vocab_size: int = VOCAB_SIZE

    def __post_init__(self) -> None:
        if self.width % self.num_heads:
            raise ValueError(f"width {self.width} must be a multiple of the {self.num_heads} heads")
        if min(self.width, self.num_layers, self.num_heads, self.context_tokens) < 1:
            raise ValueError("model width, layers, heads and context must be positive")

    @property
    def num_parameters(self) -> int:
        """Exactly what :class:`TinyLM` allocates (checked by a test)."""
        d = self.width
        block = 2 * (2 * d) + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
        embeddings = self.vocab_size * d + self.context_tokens * d
        head = 2 * d + self.vocab_size * d  # final norm + untied output layer
        return embeddings + self.num_layers * block + head


def config_for_bytes(
    gradient_bytes: int, *, num_layers: int = 4, num_heads: int = 8, context_tokens: int = 32
) -> ModelConfig:
    """The widest model whose float32 gradients fit in ``gradient_bytes``.

    Per block the parameters are ``12 d^2 + 13 d``; the width is solved from that
    quadratic and rounded down to a multiple of the head count.
    """
    if gradient_bytes < 4 * 1024:
        raise ValueError(f"a model of {gradient_bytes} bytes is too small to train (at least 4 KiB)")
    budget = gradient_bytes // 4
    fixed_per_width = 2 * VOCAB_SIZE + context_tokens + 2 + 13 * num_layers
    a, b = 12 * num_layers, fixed_per_width
    width = int((-b + math.sqrt(b * b + 4 * a * budget)) / (2 * a))
    width = max(num_heads, width - width % num_heads)
    return ModelConfig(width=width, num_layers=num_layers, num_heads=num_heads, context_tokens=context_tokens)


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP, each with a residual connection."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d = config.width
        self.num_heads = config.num_heads
        self.norm_attention = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.projection = nn.Linear(d, d)
        self.norm_mlp = nn.LayerNorm(d)
        self.mlp_in = nn.Linear(d, 4 * d)
        self.mlp_out = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        q, k, v = self.qkv(self.norm_attention(x)).split(width, dim=-1)
        heads = (batch, tokens, self.num_heads, width // self.num_heads)
        q, k, v = (t.view(heads).transpose(1, 2) for t in (q, k, v))
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.projection(attended.transpose(1, 2).reshape(batch, tokens, width))
        return x + self.mlp_out(nn.functional.gelu(self.mlp_in(self.norm_mlp(x))))


class TinyLM(nn.Module):
    """Token and position embeddings, ``num_layers`` blocks, a final norm, an output layer."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.width)
        self.position_embedding = nn.Embedding(config.context_tokens, config.width)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.norm = nn.LayerNorm(config.width)
        self.output = nn.Linear(config.width, config.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.output(self.norm(x))
        return logits


def synthetic_batch(
    config: ModelConfig, *, batch_size: int, step: int, rank: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets for one rank and step, from a fixed seed.

    The same (seed, step, rank) gives the same tokens in every run, so the torch run
    and the hipipe run of the benchmark train on identical data.
    """
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    tokens = torch.randint(0, config.vocab_size, (batch_size, config.context_tokens + 1), generator=generator)
    return tokens[:, :-1], tokens[:, 1:]
