"""tools/device_code.py's reading of SASS, with no GPU and no cuobjdump: the
opcodes and branch targets of cuobjdump -sass's text, the block barriers
counted per kernel and per loop body (a backward branch's span, the outer
loop holding its inner loops'), and a budget of barriers that fails the
check where a kernel has more.

    python -m pytest tests/ptx/test_device_code.py
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import device_code  # noqa: E402


def sass(lines):
    """cuobjdump -sass's layout: each instruction's offset, then its text and encoding."""
    out = ["\t\tFunction : _kernel_decode", "\t.headerflags\t@\"EF_CUDA_SM90\""]
    for offset, text in lines:
        out.append(f"        /*{offset:04x}*/                   {text} ;  /* 0x000000000000794d */")
        out.append("                                                                  /* 0x000fea0003800000 */")
    return "\n".join(out)


# A kernel whose serial loop (0x0100..0x0500) holds an inner loop
# (0x0200..0x0300) with one barrier, two barriers of its own (one that a
# uniform branch skips: still static), and a barrier after the loop.
KERNEL = sass([
    (0x0000, "S2R R0, SR_TID.X"),
    (0x0100, "LDG.E.64 R2, desc[UR4][R4.64]"),
    (0x0200, "BAR.SYNC.DEFER_BLOCKING 0x0"),
    (0x0210, "@!P0 BRA 0x0260"),
    (0x0220, "BAR.RED.POPC RZ, 0x0, P1"),
    (0x0260, "NOP"),
    (0x0300, "@P1 BRA 0x0200"),
    (0x0400, "BAR.SYNC.DEFER_BLOCKING 0x0"),
    (0x0410, "WARPSYNC.ALL"),
    (0x0420, "BSSY B0, 0x0480"),
    (0x0480, "BSYNC B0"),
    (0x0500, "@P2 BRA 0x0100"),
    (0x0510, "BAR.ARV 0x1, 0x80"),
    (0x0520, "EXIT"),
    (0x0530, "BRA 0x0530"),
])


def test_parse_keeps_offsets_opcodes_and_branch_targets():
    (entry, instructions), = device_code.parse_sass(KERNEL).items()
    assert entry == "_kernel_decode"
    assert "NOP" not in [op for _, op, _ in instructions]
    assert (0x0210, "BRA", 0x0260) in instructions
    assert (0x0500, "BRA", 0x0100) in instructions
    assert (0x0100, "LDG.E.64", None) in instructions
    assert len(instructions) == 14


def test_barriers_per_kernel_and_per_loop_body():
    (instructions,) = device_code.parse_sass(KERNEL).values()
    # BAR.SYNC x2 in the loop, BAR.RED in it, BAR.ARV after it; not WARPSYNC, BSSY, BSYNC.
    assert device_code.barrier_counts(instructions) == (4, 3)


def test_a_kernel_without_loops_has_no_loop_barriers():
    instructions = device_code.parse_sass(sass([(0x0, "BAR.SYNC.DEFER_BLOCKING 0x0"), (0x10, "EXIT"),
                                                (0x20, "BRA 0x20")])).popitem()[1]
    assert device_code.barrier_counts(instructions) == (1, 0)


def test_five_digit_offsets():
    text = sass([(0x10000, "BAR.SYNC.DEFER_BLOCKING 0x0"), (0x10010, "@P0 BRA 0x10000")])
    assert device_code.barrier_counts(device_code.parse_sass(text).popitem()[1]) == (1, 1)


def test_barrier_budget_fails_the_check(tmp_path):
    (tmp_path / "sm90.knobs").write_text("decode.values = 4 : 4\n")
    (tmp_path / "sm90.budgets").write_text("decode_update_p* : elements P * decode.values : barriers <= 3 "
                                           ": loop_barriers <= 1\n")
    row = {"kernel": "kpool_sm90_decode_update_p16", "family": "sm90", "entry": "_kernel_decode",
           "instructions": 640, "registers": 100, "spill_bytes": 0, "load_bytes": 8, "store_bytes": 4,
           "barriers": 4, "loop_barriers": 1, "memory": {}}
    failures = device_code.apply_budgets([row], str(tmp_path))
    assert len(failures) == 1
    assert "barriers 4 > budget 3" in failures[0]
    row["barriers"], row["loop_barriers"] = 3, 2
    failures = device_code.apply_budgets([row], str(tmp_path))
    assert len(failures) == 1 and "loop_barriers 2 > budget 1" in failures[0]
    row["loop_barriers"] = 1
    assert device_code.apply_budgets([row], str(tmp_path)) == []


def test_a_barrier_budget_is_a_most(tmp_path):
    path = tmp_path / "sm90.budgets"
    path.write_text("decode_update_p* : elements 1 : barriers >= 2\n")
    with pytest.raises(SystemExit, match="not a budget"):
        device_code.parse_budgets(str(path))
