"""HuggingFace's Trainer reads every micro-batch's loss on the host (``hf_trainer_loop``).

The check runs the real ``transformers.Trainer`` on this CPU (one optimizer step of three
accumulated micro-batches of a tiny Llama) and records, in issue order, each forward's
start, each backward's end (the embedding's gradient, the last one autograd computes) and
each device-to-host read (``aten._local_scalar_dense``: every ``.item()`` and ``bool()`` of a
tensor goes through it). The mechanism says the host waits for the device between a
micro-batch's backward and the next forward; the recorded order must show a read there.
Skipped without transformers (not a dependency of this project).
"""
from __future__ import annotations

import pytest

from simulator.cost.host import pass_syncs
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan

MICRO_BATCHES = 3


def _trainer_log(tmp_path) -> list[str]:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from torch.utils._python_dispatch import TorchDispatchMode

    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                   num_key_value_heads=2, num_hidden_layers=1, vocab_size=128,
                                   max_position_embeddings=64, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg)
    ids = torch.randint(0, 128, (MICRO_BATCHES, 16))
    data = [{"input_ids": row, "labels": row, "attention_mask": torch.ones_like(row)}
            for row in ids]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=1, max_steps=1,
        gradient_accumulation_steps=MICRO_BATCHES, use_cpu=True, report_to="none",
        save_strategy="no", logging_steps=1000, dataloader_num_workers=0, disable_tqdm=True)
    log: list[str] = []

    class Reads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                log.append("read")
            return func(*args, **(kwargs or {}))

    model.register_forward_pre_hook(lambda *_: log.append("forward"))
    model.model.layers[0].register_forward_pre_hook(lambda *_: log.append("layer"))
    model.model.embed_tokens.weight.register_post_accumulate_grad_hook(
        lambda _: log.append("backward end"))
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    with Reads():
        trainer.train()
    return log


def test_trainer_reads_the_loss_between_micro_batches(tmp_path):
    """Forward i + 1 starts only after the loss check's two reads (isnan, then isinf) that
    follow backward i's end, for every micro-batch of the step: what ``sync_before_fwd``
    prices. Inside a micro-batch the only reads are the model's own mask preparation, before
    its first layer (transformers 5.x's sdpa mask checks the padding mask on the host): a
    wait at the same place, a few ops later."""
    log = _trainer_log(tmp_path)
    forwards = [i for i, e in enumerate(log) if e == "forward"]
    ends = [i for i, e in enumerate(log) if e == "backward end"]
    layers = [i for i, e in enumerate(log) if e == "layer"]
    assert len(forwards) == len(ends) == len(layers) == MICRO_BATCHES
    for k in range(1, MICRO_BATCHES):
        assert ends[k - 1] < forwards[k]
        assert log[ends[k - 1] + 1:forwards[k]].count("read") == 2, (k, log)
    for f, first_layer, e in zip(forwards, layers, ends):
        assert "read" not in log[first_layer:e], log


def test_hf_plans_wait_before_every_forward():
    """The ``hf`` framework carries the mechanism, and it is a wait before each forward
    (engine behaviour of such waits: tests/simulator/engine/test_host_syncs.py)."""
    plan = with_framework(Plan(micro_batch=1, global_batch=4), "hf")
    assert "hf_trainer_loop" in plan.host_mechanisms
    assert pass_syncs(plan.host_mechanisms) == (True, False)
    for other in ("pytorch", "fsdp", "fsdp2", "deepspeed", "torchtitan"):
        assert "hf_trainer_loop" not in with_framework(
            Plan(micro_batch=1, global_batch=4), other).host_mechanisms
