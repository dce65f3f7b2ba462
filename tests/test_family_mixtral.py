"""Mixtral as a model family of petals 2.2 (``monitor.families.mixtral``), checked against the
reference implementation itself — current transformers' Mixtral, run in a child process of its own
(``monitor.harness.reference``) — never against our own code.

- Every block, as a server or the correctness probes load it (petals' ``load_pretrained_block``),
  gives the reference's per-layer hidden states, for a whole prompt and token by token through the
  attention cache laid out as petals' servers keep it.
- With a small ``sliding_window`` the same holds for a prompt longer than the window, against the
  reference's SDPA and eager attention alike (both mask keys outside the window in 4.46.3).
- On a real swarm (two servers splitting the blocks), petals' client generates the reference's
  greedy continuations token for token, and continues a session with new tokens as the reference
  continues the whole text.

The tiny checkpoint has a tokenizer.json our tokenizers cannot read yet, so everything here is in
token ids.
"""

from __future__ import annotations

import json
import random
import warnings

import pytest
import torch
from safetensors import safe_open

from monitor import compat  # noqa: F401  (must precede petals)
from monitor import families
from monitor.harness import reference
from monitor.harness.local_swarm import LocalSwarm, ServerSpec
from monitor.harness.tiny_model import TINY_NUM_BLOCKS, tiny_model
from monitor.swarm.correctness import ReferenceModel, relative_error
from support import STEADY_UPDATE_PERIOD, require_reference

pytestmark = pytest.mark.swarm

SPECS = (ServerSpec("mixtral-1", 0, 4), ServerSpec("mixtral-2", 4, TINY_NUM_BLOCKS))
NEW_TOKENS = 16
LONG_PROMPT = 12  # tokens: at least one full-length continuation is of a prompt this long
STATE_TOLERANCE = 1e-5  # relative L2 error per layer (float32 everywhere; measured: 0)
SLIDING_WINDOW = 8
TOKENS = 24  # positions in the hidden-state checks: three windows' worth


@pytest.fixture(scope="module")
def model(data_dir):
    require_reference()
    return tiny_model(data_dir, "mixtral")


@pytest.fixture(scope="module")
def eos(model) -> int:
    return json.loads((model.path / "config.json").read_text())["eos_token_id"]


@pytest.fixture(scope="module")
def reference_states():
    """path, attention implementation -> the reference's hidden states for the probes' input of
    ``TOKENS`` positions (the checkpoint's embeddings of seeded tokens, ``ReferenceModel.input_for(0)``):
    ``hidden_states`` (as ``output_hidden_states`` gives them) and ``layer_outputs`` (layer i's
    output). Computed once per checkpoint and implementation."""
    computed = {}

    def states(path, attn_implementation: str = "sdpa") -> dict:
        key = (str(path), attn_implementation)
        if key not in computed:
            inputs = ReferenceModel(path, TINY_NUM_BLOCKS, tokens=TOKENS).input_for(0)
            out = reference.run("hidden_states", {"path": str(path), "inputs_embeds": inputs.tolist(),
                                                  "attn_implementation": attn_implementation})
            assert out["attn_implementation"] == attn_implementation
            computed[key] = {name: [torch.tensor(s) for s in out[name]]
                             for name in ("hidden_states", "layer_outputs")}
        return computed[key]

    return states


def local_block(path, index: int):
    from petals.server.from_pretrained import load_pretrained_block
    from petals.utils.auto_config import AutoDistributedConfig

    families.install()
    config = AutoDistributedConfig.from_pretrained(str(path))
    with compat.MODEL_BUILD_LOCK, warnings.catch_warnings():
        # petals loads weights into a block built on the meta device; torch warns about each one
        warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter", category=UserWarning)
        return load_pretrained_block(str(path), index, config=config, torch_dtype=torch.float32)


def decode_through_cache(block, inputs: torch.Tensor, prefill: int) -> torch.Tensor:
    """The block's outputs for ``inputs`` as a server computes them in an inference session: the
    first ``prefill`` positions in one step, then one position per step, its cache carried over in
    petals' layout (keys [batch * kv heads, head dim, length], values [batch * kv heads, length, head dim])."""
    outputs, past = [], None
    steps = [(0, prefill)] + [(i, i + 1) for i in range(prefill, inputs.shape[1])]
    with torch.inference_mode():
        for start, end in steps:
            output, past = block(inputs[:, start:end], layer_past=past, use_cache=True)
            assert past[0].shape[-1] == end and past[1].shape[1] == end
            outputs.append(output)
    return torch.cat(outputs, dim=1)


# ---- registration and layout ------------------------------------------------------------------------


def test_mixtral_is_registered_once_with_transformers_and_petals(model):
    from petals.utils.auto_config import AutoDistributedConfig, _CLASS_MAPPING
    from transformers import AutoConfig

    from monitor.families import mixtral

    families.install()
    mixtral.register()  # idempotent
    config = AutoConfig.from_pretrained(model.path)
    assert type(config).__name__ == "MixtralConfig" and config.model_type == "mixtral"
    assert (config.num_local_experts, config.num_experts_per_tok, config.sliding_window) == (4, 2, None)
    distributed = AutoDistributedConfig.from_pretrained(model.path)
    assert distributed.block_prefix == "model.layers" and distributed.num_key_value_groups == 2
    assert _CLASS_MAPPING["mixtral"].model_for_causal_lm.__name__ == "DistributedMixtralForCausalLM"


def test_a_block_holds_exactly_its_checkpoint_keys(model):
    block = local_block(model.path, 3)
    with safe_open(str(model.path / "model.safetensors"), "pt") as f:
        keys = {k.removeprefix("model.layers.3.") for k in f.keys() if k.startswith("model.layers.3.")}
    assert set(dict(block.named_parameters())) == keys
    assert {"block_sparse_moe.gate.weight", "block_sparse_moe.experts.3.w2.weight", "self_attn.k_proj.weight",
            "post_attention_layernorm.weight"} <= keys


# ---- the blocks against the reference's hidden states ------------------------------------------------


def test_local_reference_blocks_give_the_reference_models_hidden_states(model, reference_states):
    states = ReferenceModel(model.path, TINY_NUM_BLOCKS, tokens=TOKENS).states()  # load_pretrained_block, block by block
    expected = reference_states(model.path)
    assert relative_error(states[0], expected["hidden_states"][0]) == 0  # (the same input)
    for index in range(TINY_NUM_BLOCKS):
        error = relative_error(states[index + 1], expected["layer_outputs"][index])
        assert error < STATE_TOLERANCE, (index, error)
    # (output_hidden_states gives the layers' outputs, the last one after the final norm)
    for index in range(TINY_NUM_BLOCKS - 1):
        assert relative_error(states[index + 1], expected["hidden_states"][index + 1]) < STATE_TOLERANCE


@pytest.fixture(scope="module")
def sliding(model, tmp_path_factory):
    """The tiny checkpoint with ``sliding_window`` 8, saved by the reference."""
    path = tmp_path_factory.mktemp("mixtral-sliding") / "tiny-mixtral-sliding"
    saved = reference.run("save_variant", {"path": str(model.path), "out": str(path),
                                           "config": {"sliding_window": SLIDING_WINDOW,
                                                      "dht_prefix": "tiny-mixtral-sliding"}})
    assert saved["config"]["sliding_window"] == SLIDING_WINDOW and saved["config"]["model_type"] == "mixtral"
    return path


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_a_sliding_window_is_applied_as_the_reference_applies_it(model, sliding, reference_states,
                                                                 attn_implementation):
    states = ReferenceModel(sliding, TINY_NUM_BLOCKS, tokens=TOKENS).states()
    expected = reference_states(sliding, attn_implementation)
    assert relative_error(states[0], expected["hidden_states"][0]) == 0
    for index in range(TINY_NUM_BLOCKS):
        error = relative_error(states[index + 1], expected["layer_outputs"][index])
        assert error < STATE_TOLERANCE, (index, error)

    # the window matters to the reference: without it, positions past the window differ, those
    # within it do not
    unwindowed = reference_states(model.path, attn_implementation)["layer_outputs"][-1]
    windowed = expected["layer_outputs"][-1]
    assert relative_error(windowed[:, :SLIDING_WINDOW], unwindowed[:, :SLIDING_WINDOW]) < STATE_TOLERANCE
    assert relative_error(windowed[:, SLIDING_WINDOW:], unwindowed[:, SLIDING_WINDOW:]) > 0.01


@pytest.mark.parametrize("variant", ["full attention", "sliding window"])
def test_token_by_token_through_the_servers_cache_layout_gives_the_reference_states(model, sliding, reference_states,
                                                                                    variant):
    path = model.path if variant == "full attention" else sliding
    expected = reference_states(path)
    prefill = 5  # then 19 single steps, the last 16 of them with keys outside the window
    for index in (0, TINY_NUM_BLOCKS // 2, TINY_NUM_BLOCKS - 1):
        layer_input = expected["hidden_states"][index]
        outputs = decode_through_cache(local_block(path, index), layer_input, prefill)
        error = relative_error(outputs, expected["layer_outputs"][index])
        assert error < STATE_TOLERANCE, (variant, index, error)


# ---- on a real swarm ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def swarm(model):
    with LocalSwarm(model.path, model.dht_prefix, update_period=STEADY_UPDATE_PERIOD) as swarm:
        swarm.start(SPECS)
        yield swarm


@pytest.fixture(scope="module")
def client(model, swarm):
    from chat.remote_model import load_remote_model, sequence_manager_of

    client = load_remote_model(model.path, swarm.dht)
    yield client
    sequence_manager_of(client).shutdown()


def candidate_prompts(vocab_size: int) -> list[list[int]]:
    """BOS, then seeded ordinary tokens (past <unk>, <s>, </s>): short and long prompts."""
    rng = random.Random(2024)
    return [[1] + [rng.randrange(3, vocab_size) for _ in range(length - 1)] for length in (3, 6, 12, 20, 33)]


def reference_continuations(path, prompts: list[list[int]]) -> list[list[int]]:
    out = reference.run("reference", {"path": str(path), "generate": prompts, "max_new_tokens": NEW_TOKENS})
    return out["generated"]


def test_petals_client_generates_the_references_greedy_continuations(model, client, eos):
    from petals.utils.auto_config import AutoDistributedConfig

    prompts = candidate_prompts(AutoDistributedConfig.from_pretrained(model.path).vocab_size)
    expected = reference_continuations(model.path, prompts)
    full = [(prompt, new) for prompt, new in zip(prompts, expected) if len(new) == NEW_TOKENS and eos not in new]
    assert full, f"the reference stopped early on every candidate: {expected}"
    assert max(len(prompt) for prompt, _ in full) >= LONG_PROMPT, [len(p) for p, _ in full]

    for prompt, new in full:
        out = client.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)
        assert out[0, len(prompt):].tolist() == new, (len(prompt), new)


def test_a_session_continued_with_new_tokens_generates_what_the_reference_continues(model, client, eos):
    """The chat's next turn: a session's second ``generate`` sends several new tokens at once
    past the servers' cache (queries at positions ≥ 1 over a longer key range)."""
    first, turn = [1, 300, 41, 512, 77, 9], [88, 143, 620, 35, 401]
    [reply] = reference_continuations(model.path, [first])
    whole = first + reply
    [continued] = reference_continuations(model.path, [whole + turn])
    assert eos not in reply, reply

    with client.inference_session(max_length=len(whole + turn) + NEW_TOKENS) as session:
        out = client.generate(torch.tensor([first]), max_new_tokens=NEW_TOKENS, do_sample=False, session=session)
        assert out[0, len(first):].tolist() == reply
        out = client.generate(torch.tensor([turn]), max_new_tokens=len(continued), do_sample=False, session=session)
    assert out[0, len(turn):].tolist() == continued
