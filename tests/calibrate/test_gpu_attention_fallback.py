"""A GPU calibration whose attention points never show a forward+backward longer than the
forward of the same shape (a busy host's noise on tiny shapes) does not abort the whole
calibration: that (dtype, kernel) is not fitted, the notes say so, and the usable one is."""
from __future__ import annotations

import hardware_db
from calibrate.gpu_profile import fit_attention_gpu


def _row(seq: int, pas: str, t_s: float, dtype: str = "bf16") -> dict:
    flops = 4.0 * 2 * seq * seq * 64 / 2
    return {"point": f"1x2x{seq}x64:{dtype}:flash:{pas}", "batch": 1, "heads": 2, "seq": seq,
            "head_dim": 64, "pass": pas, "dtype": dtype, "backend": "flash",
            "flops_fwd": flops, "median_s": t_s, "p10_s": t_s}


def test_unusable_pairs_are_skipped_with_a_note_and_usable_ones_fitted():
    gpu = hardware_db.load_gpu("h200-sxm")
    noisy = [_row(s, "fwd", 2e-4) for s in (128, 256)] + \
            [_row(s, "fwd_bwd", 1e-4) for s in (128, 256)]
    model, fits, notes = fit_attention_gpu(noisy, gpu, 5.0, "test")
    assert model.fwd_eff == {} and model.bwd_eff == {} and fits == {}
    assert any("bf16 flash" in n and "not fitted" in n for n in notes)
    good = [_row(s, "fwd", 1e-4 * s / 128, "fp16") for s in (128, 256, 512)] + \
           [_row(s, "fwd_bwd", 3.5e-4 * s / 128, "fp16") for s in (128, 256, 512)]
    model, fits, notes = fit_attention_gpu(noisy + good, gpu, 5.0, "test")
    assert set(model.fwd_eff) == {"fp16"} and set(model.bwd_eff) == {"fp16"}
    assert any("not fitted" in n for n in notes)
