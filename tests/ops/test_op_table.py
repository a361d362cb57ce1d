"""cmake/op_table.py on the project's table and on broken copies of it: the
variant matrix it expands, and a malformed table stopped with its file and
reason (the configure prints them)."""

import os
import shutil
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "cmake"))
import op_table  # noqa: E402

TABLE = os.path.join(REPO, "ops")
CPU_AXES = {"pool": ["1", "2", "4"], "arithmetic": ["exact"], "words_arithmetic": []}
CUDA_AXES = {"pool": ["1", "4", "16"], "block_pool": ["4", "16"], "arithmetic": ["exact", "triton"],
             "words_arithmetic": ["triton"]}


def functions(device, cuda, axes, **selection):
    table = op_table.load([TABLE])
    return {f: (k["kind"], params, key) for k, f, params, key in op_table.variants(table, device, cuda, axes,
                                                                                   **selection)}


def test_the_matrix_spans_each_kernels_axes_on_its_devices():
    cpu = functions("cpu", False, CPU_AXES)
    assert cpu["kpool_cpu_compress_to_cache_p2_f32"] == (
        "COMPRESS_TO_CACHE", ["pool_size=2", "slot_k.type=uint16", "slot_score.type=float32", "arithmetic=exact",
                              "loc.type=int64"], {"pool": "2", "type": "f32", "arithmetic": "exact"})
    assert cpu["kpool_cpu_decode_stash_tail_i64"][2] == {"pool": "0", "type": "int64", "arithmetic": "any"}
    assert not [f for f in cpu if "words" in f or "decode_update" in f or "index_check" in f]  # CUDA's alone
    cuda = functions("sm90", True, CUDA_AXES)
    assert "kpool_sm90_compress_to_cache_words_p16_bf16_i32_triton" in cuda
    assert "kpool_sm90_compress_to_cache_words_p16_bf16_i32" not in cuda  # words: the triton arithmetic only here
    # The block-per-request decode: the block layout's pool sizes only (block_pool).
    assert "kpool_sm90_decode_update_by_block_p16_triton" in cuda
    assert "kpool_sm90_decode_update_p1_triton" in cuda and "kpool_sm90_decode_update_by_block_p1_triton" not in cuda
    assert "kpool_sm90_decode_update_ragged_by_block_p1" not in cuda
    assert cuda["kpool_sm90_decode_update_by_request_p4_triton_i64"][1] == [
        "pool_size=4", "arithmetic=triton", "layout=warp_per_request", "aligned_rows=true",
        "tail_slot_mapping.type=int64", "slot_mapping.type=int64", "positions.type=int64"]


def test_a_candidate_holds_the_kernels_its_ops_tune():
    axes = dict(CPU_AXES, score=["bf16"], index=["int32"])
    cpu = functions("cpu", False, axes, candidate="7", tune_ops=["decode", "seed"])
    assert sorted(cpu) == ["kpool_cpu_decode_write_cache_p1_c7", "kpool_cpu_decode_write_cache_p2_c7",
                           "kpool_cpu_decode_write_cache_p4_c7", "kpool_cpu_seed_tail_int32_c7"]
    cuda = functions("sm90", True, dict(CUDA_AXES, score=["bf16"], index=["int32"]), candidate="3",
                     tune_ops=["decode"])
    assert not [f for f in cuda if "write_cache" in f]  # (timed on the CPU only)


@pytest.fixture
def broken(tmp_path):
    """A copy of the table and a way to rewrite one of its files."""
    shutil.copytree(TABLE, tmp_path / "ops")

    def rewrite(name, old, new):
        path = tmp_path / "ops" / name
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new, 1))
        return str(tmp_path / "ops")

    return rewrite


@pytest.mark.parametrize("name, old, new, message", [
    ("seed_tail_cache.toml", 'axes = ["index"]', 'axes = ["indices"]', "axis 'indices' is not in axes.toml"),
    ("seed_tail_cache.toml", 'function = "seed_tail_{index}"', 'function = "seed_tail_{pool}"', "uses ['pool']"),
    ("expand.toml", 'kind = "APPEND_TAIL_TO_TOPK"', 'kind = "SEED_TAIL"', "kernel kind SEED_TAIL is declared twice"),
    ("expand.toml", '"topk: int32"', '"topk: int16"', "is not \"name: type [rules]\""),
    ("fwht128_quant_fp8.toml", "tune = ", "tuned = ", "unknown keys ['tuned']"),
])
def test_a_malformed_table_names_its_file_and_the_fault(broken, name, old, new, message):
    table = broken(name, old, new)
    with pytest.raises(op_table.TableError) as e:
        op_table.load([table])
    assert name in str(e.value) and message in str(e.value)


def test_an_undeclared_axis_value_names_the_axis():
    table = op_table.load([TABLE])
    with pytest.raises(op_table.TableError, match="axis arithmetic: the build asks for \\['fast'\\]"):
        list(op_table.variants(table, "sm90", True, dict(CUDA_AXES, arithmetic=["fast"])))
