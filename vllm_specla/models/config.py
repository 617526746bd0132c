"""The ``gated_deltanet`` model config (fla checkpoint format), importable without vLLM or fla.

Field names and defaults follow fla 0.6.0
``fla/models/gated_deltanet/configuration_gated_deltanet.py`` so a checkpoint written by fla's
``GatedDeltaNetForCausalLM.save_pretrained`` loads unchanged. Fields that change the math in
ways we do not implement are refused with an error that names them (:func:`check_supported`).
"""

from __future__ import annotations

import math

from transformers import PretrainedConfig


class UnsupportedConfigError(ValueError):
    """A checkpoint config field has a value vllm_specla does not implement."""


class GatedDeltaNetConfig(PretrainedConfig):
    """fla ``GatedDeltaNetConfig`` (``model_type: gated_deltanet``), pure GDN layers only.

    Derived sizes (properties): ``head_k_dim = head_dim``, ``head_v_dim = head_dim * expand_v``,
    ``key_dim = num_heads * head_k_dim``, ``value_dim = num_v_heads * head_v_dim``,
    ``conv_dim = 2 * key_dim + value_dim``; ``intermediate_size`` defaults to fla's rule
    ``256 * ceil(int(hidden * hidden_ratio * 2/3) / 256)``.
    """

    model_type = "gated_deltanet"
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(
        self,
        attn_mode: str = "chunk",
        hidden_size: int = 2048,
        expand_v: float = 2.0,
        use_gate: bool = True,
        use_short_conv: bool = True,
        allow_neg_eigval: bool = False,
        conv_size: int = 4,
        head_dim: int = 256,
        num_heads: int = 6,
        num_v_heads: int | None = None,
        max_position_embeddings: int = 2048,
        hidden_ratio: int | None = 4,
        intermediate_size: int | None = None,
        hidden_act: str = "swish",
        num_hidden_layers: int = 21,
        norm_eps: float = 1e-6,
        attn: dict | None = None,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int = 1,
        eos_token_id: int = 2,
        tie_word_embeddings: bool = False,
        initializer_range: float = 0.02,
        fuse_norm: bool = True,
        fuse_swiglu: bool = True,
        fuse_cross_entropy: bool = True,
        fuse_linear_cross_entropy: bool = False,
        use_l2warp: bool = False,
        vocab_size: int = 32000,
        attnres_block_size: int | None = None,
        output_gate_activation: str = "swish",
        conv_bias: bool = False,
        **kwargs,
    ):
        self.attn_mode = attn_mode
        self.hidden_size = hidden_size
        self.expand_v = expand_v
        self.use_gate = use_gate
        self.use_short_conv = use_short_conv
        self.allow_neg_eigval = allow_neg_eigval
        self.conv_size = conv_size
        self.head_dim = head_dim
        self.num_heads = num_heads
        self.num_v_heads = num_v_heads
        self.max_position_embeddings = max_position_embeddings
        self.hidden_ratio = hidden_ratio
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.num_hidden_layers = num_hidden_layers
        self.norm_eps = norm_eps
        self.attn = attn
        self.use_cache = use_cache
        self.initializer_range = initializer_range
        self.fuse_norm = fuse_norm
        self.fuse_swiglu = fuse_swiglu
        self.fuse_cross_entropy = fuse_cross_entropy
        self.fuse_linear_cross_entropy = fuse_linear_cross_entropy
        self.use_l2warp = use_l2warp
        self.vocab_size = vocab_size
        self.attnres_block_size = attnres_block_size
        self.output_gate_activation = output_gate_activation
        self.conv_bias = conv_bias
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def n_v_heads(self) -> int:
        return self.num_v_heads if self.num_v_heads is not None else self.num_heads

    @property
    def head_k_dim(self) -> int:
        return self.head_dim

    @property
    def head_v_dim(self) -> int:
        return int(self.head_dim * self.expand_v)

    @property
    def key_dim(self) -> int:
        return self.num_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.n_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def mlp_intermediate_size(self) -> int:
        if self.intermediate_size is not None:
            return self.intermediate_size
        ratio = self.hidden_ratio if self.hidden_ratio is not None else 4
        i = int(self.hidden_size * ratio * 2 / 3)
        return 256 * ((i + 256 - 1) // 256)


def check_supported(config: PretrainedConfig) -> None:
    """Refuse checkpoint configs whose fields we do not implement.

    Raises:
        UnsupportedConfigError: naming the field, its value and the allowed values.
    """
    mt = getattr(config, "model_type", None)
    if mt != "gated_deltanet":
        raise UnsupportedConfigError(f"model_type={mt!r}: vllm_specla serves 'gated_deltanet' checkpoints only")
    if getattr(config, "attn", None):
        raise UnsupportedConfigError(
            f"attn={config.attn!r}: hybrid attention layers are not supported (allowed: null, pure GDN)"
        )
    if getattr(config, "attnres_block_size", None) is not None:
        raise UnsupportedConfigError(
            f"attnres_block_size={config.attnres_block_size!r}: attention residuals are not supported (allowed: null)"
        )
    if config.hidden_act != "swish":
        raise UnsupportedConfigError(f"hidden_act={config.hidden_act!r}: allowed values: 'swish'")
    if config.output_gate_activation not in ("swish", "silu", "sigmoid"):
        raise UnsupportedConfigError(
            f"output_gate_activation={config.output_gate_activation!r}: allowed values: 'swish', 'silu', 'sigmoid'"
        )
    hv = config.num_v_heads if config.num_v_heads is not None else config.num_heads
    if hv % config.num_heads != 0:
        raise UnsupportedConfigError(
            f"num_v_heads={hv}: must be a multiple of num_heads={config.num_heads}"
        )
    if not math.isclose(config.head_dim * config.expand_v, int(config.head_dim * config.expand_v)):
        raise UnsupportedConfigError(
            f"expand_v={config.expand_v}: head_dim * expand_v must be an integer (head_dim={config.head_dim})"
        )
    if config.conv_size < 2:
        raise UnsupportedConfigError(f"conv_size={config.conv_size}: allowed values: >= 2")


def check_tensor_parallel(config: PretrainedConfig, tp_size: int, vocab_padding: int = 64) -> None:
    """Refuse a tensor-parallel size that does not split the target's layers (vLLM's parallel layers assert deep
    inside each worker otherwise, ``worker/model.py``).

    ``tp_size`` must divide ``num_heads``, ``num_v_heads``, the MLP's intermediate size and the vocabulary padded
    to ``vocab_padding`` (vLLM's ``VocabParallelEmbedding`` / ``ParallelLMHead``, padding 64). The drafter is a
    full copy on every rank, so it sets no condition.

    Raises:
        UnsupportedConfigError: naming ``tensor_parallel_size``, the sizes it must divide and the sizes that work.
    """
    cfg = as_gdn_config(config)
    vocab = -(-cfg.vocab_size // vocab_padding) * vocab_padding
    sizes = {"num_heads": cfg.num_heads, "num_v_heads": cfg.n_v_heads, "intermediate_size": cfg.mlp_intermediate_size,
             "vocab_size": vocab}
    if any(n % tp_size for n in sizes.values()):
        ok = [t for t in range(1, cfg.num_heads + 1) if all(n % t == 0 for n in sizes.values())]
        raise UnsupportedConfigError(
            f"tensor_parallel_size={tp_size}: must divide " + ", ".join(f"{k}={n}" for k, n in sizes.items())
            + f" (vocab_size padded to a multiple of {vocab_padding}); allowed for this model: "
            + ", ".join(map(str, ok)))


def as_gdn_config(config: PretrainedConfig) -> GatedDeltaNetConfig:
    """Our :class:`GatedDeltaNetConfig` for any ``gated_deltanet`` config object.

    fla registers its own ``GatedDeltaNetConfig`` with transformers' ``AutoConfig`` when ``fla`` is
    imported, and whichever registration ran last decides the class vLLM hands the model; this
    converts fla's (or any) config with the same fields so the derived sizes are always available.
    """
    if isinstance(config, GatedDeltaNetConfig):
        return config
    d = {k: v for k, v in config.to_dict().items() if k not in ("model_type", "transformers_version")}
    return GatedDeltaNetConfig(**d)
