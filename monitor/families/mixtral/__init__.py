"""Mixtral (``mistralai/Mixtral-8x7B``, ``-8x22B``): a family of its own for petals 2.2 on
transformers 4.34, which knows neither.

``register()`` teaches this process to read a Mixtral checkpoint (idempotent; cheap after the first
call): transformers' ``AutoConfig`` learns ``model_type: mixtral`` (``config.MixtralConfig``; and
``AutoTokenizer`` Llama's tokenizer classes for it, as current transformers map it), and
petals' registry learns its distributed classes — the config a server and the client read
(``DistributedMixtralConfig``), the client's model and causal LM (``model``: the checkpoint's
embeddings, final norm and head locally, the layers on the swarm), the server block
(``block.WrappedMixtralBlock``: grouped-query attention with rotary positions and an optional
sliding window, then the sparse mixture of experts). Checkpoint keys are the published ones:
``model.embed_tokens``, ``model.layers.N.self_attn.{q,k,v,o}_proj``,
``model.layers.N.block_sparse_moe.gate``, ``model.layers.N.block_sparse_moe.experts.E.{w1,w2,w3}``,
``model.layers.N.{input,post_attention}_layernorm``, ``model.norm``, ``lm_head``.
"""

from __future__ import annotations

MODEL_TYPE = "mixtral"


def register() -> None:
    """Register Mixtral with transformers' AutoConfig and petals 2.2's model registry (idempotent:
    each registration is made only where its registry lacks it; ``families.install`` calls this
    once per process, under its lock)."""
    from monitor import compat

    compat.import_petals()
    from petals.utils.auto_config import _CLASS_MAPPING, register_model_classes
    from transformers import AutoConfig, AutoTokenizer, LlamaTokenizer, LlamaTokenizerFast
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING

    from monitor.families.mixtral.config import DistributedMixtralConfig, MixtralConfig
    from monitor.families.mixtral.model import (
        DistributedMixtralForCausalLM,
        DistributedMixtralForSequenceClassification,
        DistributedMixtralModel,
    )

    if MODEL_TYPE not in CONFIG_MAPPING:
        AutoConfig.register(MODEL_TYPE, MixtralConfig)
    if MixtralConfig not in TOKENIZER_MAPPING:  # (as current transformers map mixtral, for a
        # tokenizer_config.json that names no tokenizer class)
        AutoTokenizer.register(MixtralConfig, slow_tokenizer_class=LlamaTokenizer,
                               fast_tokenizer_class=LlamaTokenizerFast)
    if MODEL_TYPE not in _CLASS_MAPPING:
        register_model_classes(
            config=DistributedMixtralConfig,
            model=DistributedMixtralModel,
            model_for_causal_lm=DistributedMixtralForCausalLM,
            model_for_sequence_classification=DistributedMixtralForSequenceClassification,
        )
