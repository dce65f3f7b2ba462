"""The client side of Mixtral for petals 2.2: the checkpoint's embeddings, final norm and head
locally, every decoder layer on the swarm (``RemoteSequential``).

Outside its decoder layers Mixtral is Mistral — token embeddings, an RMS norm, an untied head
(``model.embed_tokens``, ``model.norm``, ``lm_head``), no position embeddings (the servers rotate
queries and keys) — and transformers 4.34 has Mistral. So these are Mistral's classes with their
layers replaced by the swarm, as petals 2.2 does for Llama.
"""

from __future__ import annotations

from typing import Any, Optional

from monitor import compat  # noqa: F401  (must precede petals)
import hivemind
import torch
import torch.nn as nn
from petals.client.from_pretrained import FromPretrainedMixin
from petals.client.lm_head import LMHead
from petals.client.ptune import PTuneMixin
from petals.client.remote_generation import RemoteGenerationMixin, RemotePastKeyValues
from petals.client.remote_sequential import RemoteSequential
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.models.mistral.modeling_mistral import (
    MistralForCausalLM,
    MistralForSequenceClassification,
    MistralModel,
    MistralPreTrainedModel,
)

from monitor.families.mixtral.config import DistributedMixtralConfig


class DistributedMixtralModel(FromPretrainedMixin, PTuneMixin, MistralModel):
    """Mixtral's base model with all decoder layers hosted by the swarm."""

    _keys_to_ignore_on_load_missing = PTuneMixin._keys_to_ignore_on_load_missing
    _keys_to_ignore_on_load_unexpected = [r"^model\.layers\."]

    config_class = DistributedMixtralConfig
    layers: Any  # RemoteSequential once built (transformers' ModuleList of no layers before)

    def __init__(self, config: DistributedMixtralConfig, *, dht: Optional[hivemind.DHT] = None):
        n_layer, config.num_hidden_layers = config.num_hidden_layers, 0  # no local layers
        super().__init__(config)
        assert len(self.layers) == 0
        config.num_hidden_layers = n_layer

        self.layers = RemoteSequential(config, dht=dht)

        self.requires_grad_(False)  # the embeddings and the norm accumulate no gradients
        self.init_prompts(config)

    def forward(
        self,
        input_ids: Optional[torch.LongTensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.LongTensor] = None,
        past_key_values: Optional[RemotePastKeyValues] = None,
        inputs_embeds: Optional[torch.FloatTensor] = None,
        use_cache: Optional[bool] = None,
        output_attentions: Optional[bool] = None,
        output_hidden_states: Optional[bool] = None,
        return_dict: Optional[bool] = None,
    ) -> BaseModelOutputWithPast:
        if input_ids is not None and inputs_embeds is not None:
            raise ValueError("You cannot specify both input_ids and inputs_embeds at the same time")
        elif input_ids is not None:
            input_shape = input_ids.size()
            input_ids = input_ids.view(-1, input_shape[-1])  # type: ignore[assignment]  # torch's view: a Tensor
        elif inputs_embeds is not None:
            input_shape = inputs_embeds.size()[:-1]
        else:
            raise ValueError("You have to specify either input_ids or inputs_embeds")

        # the servers build the causal mask and the positions from their caches
        assert attention_mask is None or (attention_mask == 1).all(), \
            f"Custom attention masks are not supported, {attention_mask=}"
        assert position_ids is None or (position_ids[:, 1:] - position_ids[:, :-1] == 1).all(), \
            f"Non-consecutive position_ids are not supported, {position_ids=}"
        assert use_cache is None or use_cache, f"{use_cache=} is not supported"
        assert not output_attentions, f"{output_attentions=} is not supported"
        assert not output_hidden_states, f"{output_hidden_states=} is not supported"
        assert return_dict is None or return_dict, f"{return_dict=} is not supported"

        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)

        use_prompts = self.config.tuning_mode and "ptune" in self.config.tuning_mode and self.layers.position == 0
        if use_prompts:
            prompts, intermediate_prompts = self.get_prompt(inputs_embeds.shape[0])
            inputs_embeds = torch.cat([prompts, inputs_embeds], dim=1)  # type: ignore[assignment]  # a Tensor
        else:
            prompts = intermediate_prompts = None

        hidden_states = inputs_embeds
        output_shape = input_shape + (hidden_states.size(-1),)
        hidden_states = self.layers(
            hidden_states,
            prompts=intermediate_prompts,
            hypo_ids=past_key_values.hypo_ids if past_key_values is not None else None,
        )
        if use_prompts:
            hidden_states = hidden_states[:, self.pre_seq_len:]

        hidden_states = self.norm(hidden_states).view(output_shape)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=RemotePastKeyValues(),
                                       hidden_states=None, attentions=None)

    @property
    def word_embeddings(self) -> nn.Embedding:  # (the names RemoteGenerationMixin and PTuneMixin use)
        return self.embed_tokens

    @property
    def word_embeddings_layernorm(self) -> nn.Module:
        return nn.Identity()

    @property
    def h(self) -> RemoteSequential:
        return self.layers

    @property
    def ln_f(self) -> nn.Module:
        return self.norm


class DistributedMixtralForCausalLM(FromPretrainedMixin, RemoteGenerationMixin, MistralForCausalLM):
    """Mixtral's causal LM: the swarm's layers, then the local norm and head."""

    _keys_to_ignore_on_load_missing = DistributedMixtralModel._keys_to_ignore_on_load_missing
    _keys_to_ignore_on_load_unexpected = DistributedMixtralModel._keys_to_ignore_on_load_unexpected

    config_class = DistributedMixtralConfig

    def __init__(self, config: DistributedMixtralConfig):
        MistralPreTrainedModel.__init__(self, config)
        self.model = DistributedMixtralModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = LMHead(config)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head

    @property
    def transformer(self) -> DistributedMixtralModel:  # (the name RemoteGenerationMixin uses)
        return self.model


class DistributedMixtralForSequenceClassification(FromPretrainedMixin, MistralForSequenceClassification):
    _keys_to_ignore_on_load_missing = DistributedMixtralModel._keys_to_ignore_on_load_missing
    _keys_to_ignore_on_load_unexpected = DistributedMixtralModel._keys_to_ignore_on_load_unexpected

    config_class = DistributedMixtralConfig

    def __init__(self, config: DistributedMixtralConfig):
        MistralPreTrainedModel.__init__(self, config)
        self.num_labels = config.num_labels
        self.model = DistributedMixtralModel(config)
        self.score = nn.Linear(config.hidden_size, self.num_labels, bias=False)
        self.post_init()

    @property
    def transformer(self) -> DistributedMixtralModel:
        return self.model
