"""Task-vector checkpoint I/O: round trips per format, lazy reading, atomic writes, clear errors."""
import json
import os
import pickle
import re

import pytest
import torch

from icmltools.core.errors import BadInputError
from icmltools.taskvec import (
    CheckpointWriter,
    MemoryReader,
    all_finite,
    check_compatible,
    count_non_finite,
    open_checkpoint,
    read_record,
    write_state_dict,
)

torch.set_num_threads(1)


def _sd(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "enc.w": torch.randn(8, 5, generator=g),
        "enc.b": torch.randn(5, generator=g).to(torch.bfloat16),
        "head.w": torch.randn(3, 8, generator=g).to(torch.float16),
        "scale": torch.tensor(2.5, dtype=torch.float64),
        "bn.num_batches_tracked": torch.tensor(17),
        "mask": torch.tensor([True, False]),
    }


def _same(a: dict, reader) -> bool:
    return set(a) == set(reader.keys()) and all(
        reader.get(k).dtype == v.dtype and torch.equal(reader.get(k), v) for k, v in a.items())


@pytest.mark.parametrize("fmt,name", [("safetensors", "m.safetensors"), ("torch", "m.pt"),
                                      ("hf_safetensors", "hf_st"), ("hf_torch", "hf_pt")])
def test_round_trip_every_format(tmp_path, fmt, name):
    sd = _sd()
    write_state_dict(sd, tmp_path / name, fmt=fmt, record={"how": "test"})
    r = open_checkpoint(tmp_path / name)
    assert r.format == fmt
    assert _same(sd, r)
    assert read_record(tmp_path / name) == {"how": "test"}
    assert not [p for p in tmp_path.rglob("*") if ".tmp" in p.name]  # no temp files left


def test_sharded_hf_folder_round_trip_and_layout(tmp_path):
    sd = _sd()
    shards = [["enc.w", "enc.b"], ["head.w", "scale"], ["bn.num_batches_tracked", "mask"]]
    (tmp_path / "src").mkdir()
    write_state_dict(sd, tmp_path / "hf", fmt="hf_safetensors", shards=shards)
    files = sorted(p.name for p in (tmp_path / "hf").iterdir())
    assert "model.safetensors.index.json" in files
    assert [f for f in files if f.endswith(".safetensors")] == [
        "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"]
    idx = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert idx["weight_map"]["head.w"] == "model-00002-of-00003.safetensors"
    assert idx["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in sd.values())
    # a non-weight file of the base folder is carried over to a folder written from it
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "toy"}')
    base = open_checkpoint(tmp_path / "hf")
    assert [n for _, n in base.shards] == shards
    assert _same(sd, base)
    with CheckpointWriter(base, tmp_path / "copy", record={"r": 1}) as w:
        for n in w.order:
            w.write(n, base.get(n))
    copy = open_checkpoint(tmp_path / "copy")
    assert copy.format == "hf_safetensors" and _same(sd, copy)
    assert (tmp_path / "copy" / "config.json").read_text() == '{"model_type": "toy"}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy", "hf", "src"]


def test_torch_state_dict_key_is_unwrapped(tmp_path):
    sd = _sd()
    torch.save({"state_dict": sd, "epoch": 3, "optimizer": {"lr": 0.1}}, tmp_path / "w.pt")
    assert _same(sd, open_checkpoint(tmp_path / "w.pt"))


def test_safetensors_metadata_carries_the_record(tmp_path):
    from safetensors import safe_open

    write_state_dict(_sd(), tmp_path / "m.safetensors", record={"method": "negmerge", "lam": 2.0})
    with safe_open(str(tmp_path / "m.safetensors"), "pt") as f:
        assert json.loads(f.metadata()["icml"]) == {"method": "negmerge", "lam": 2.0}


def test_streamed_file_is_a_valid_safetensors_file(tmp_path):
    from safetensors.torch import load_file

    sd = _sd()
    write_state_dict(sd, tmp_path / "m.safetensors")
    loaded = load_file(str(tmp_path / "m.safetensors"))
    assert all(torch.equal(loaded[k], v) for k, v in sd.items())


def test_writer_leaves_nothing_on_error(tmp_path):
    sd = _sd()
    for fmt, name in [("safetensors", "m.safetensors"), ("torch", "m.pt"), ("hf_safetensors", "hf")]:
        mem = MemoryReader(sd)
        with pytest.raises(RuntimeError):
            with CheckpointWriter(mem, tmp_path / name, fmt=fmt) as w:
                w.write(w.order[0], sd[w.order[0]])
                raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []
    # an existing output is kept intact when a rewrite fails
    write_state_dict(sd, tmp_path / "m.safetensors")
    before = (tmp_path / "m.safetensors").read_bytes()
    with pytest.raises(RuntimeError):
        with CheckpointWriter(MemoryReader(sd), tmp_path / "m.safetensors") as w:
            w.write(w.order[0], sd[w.order[0]] + 1 if sd[w.order[0]].is_floating_point() else sd[w.order[0]])
            raise RuntimeError("interrupted")
    assert (tmp_path / "m.safetensors").read_bytes() == before


def test_writer_checks_order_and_shape(tmp_path):
    sd = _sd()
    with pytest.raises(RuntimeError, match="expected"):
        with CheckpointWriter(MemoryReader(sd), tmp_path / "m.safetensors") as w:
            w.write(w.order[1], sd[w.order[1]])
    with pytest.raises(RuntimeError):
        with CheckpointWriter(MemoryReader(sd), tmp_path / "m.safetensors") as w:
            w.write(w.order[0], torch.zeros(1))
    with pytest.raises(RuntimeError, match="left to write"):
        with CheckpointWriter(MemoryReader(sd), tmp_path / "m.safetensors") as w:
            pass
    assert list(tmp_path.iterdir()) == []


def test_bad_files_are_clear_errors(tmp_path):
    write_state_dict(_sd(), tmp_path / "ok.safetensors")
    raw = (tmp_path / "ok.safetensors").read_bytes()
    (tmp_path / "trunc.safetensors").write_bytes(raw[: len(raw) - 7])
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 3 + b"not a checkpoint" * 4)
    (tmp_path / "empty.pt").write_bytes(b"")
    torch.save(_sd(), tmp_path / "ok.pt")
    (tmp_path / "trunc.pt").write_bytes((tmp_path / "ok.pt").read_bytes()[:300])

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    (tmp_path / "evil.pt").write_bytes(pickle.dumps({"w": Evil()}))
    torch.save({"w": torch.zeros(2), "note": "text"}, tmp_path / "mixed.pt")
    cases = {"trunc.safetensors": "corrupt or truncated", "junk.safetensors": "corrupt or truncated",
             "empty.pt": "empty", "trunc.pt": "corrupt or truncated", "evil.pt": "refused|corrupt",
             "mixed.pt": "'note' is a str", "missing.safetensors": "no such file"}
    for name, pat in cases.items():
        with pytest.raises(BadInputError, match=pat) as ei:
            open_checkpoint(tmp_path / name)
        assert name in str(ei.value)


def test_hf_folder_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInputError, match="none of"):
        open_checkpoint(tmp_path / "empty")
    write_state_dict(_sd(), tmp_path / "hf", fmt="hf_safetensors", shards=[["enc.w", "enc.b", "head.w"],
                                                                            ["scale", "bn.num_batches_tracked", "mask"]])
    (tmp_path / "hf" / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(BadInputError, match="missing"):
        open_checkpoint(tmp_path / "hf")
    (tmp_path / "hf" / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"enc.w": "../outside.safetensors"}}))
    with pytest.raises(BadInputError, match="plain file name"):
        open_checkpoint(tmp_path / "hf")
    (tmp_path / "hf" / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(BadInputError, match="index JSON"):
        open_checkpoint(tmp_path / "hf")


def test_compatibility_errors_name_the_tensor(tmp_path):
    a = _sd()
    b = dict(a)
    b["enc.w"] = torch.zeros(8, 6)
    with pytest.raises(BadInputError, match="'enc.w' has shape"):
        check_compatible(MemoryReader(a), MemoryReader(b))
    b = dict(a)
    b["enc.w"] = a["enc.w"].double()
    with pytest.raises(BadInputError, match="'enc.w' has dtype float64"):
        check_compatible(MemoryReader(a), MemoryReader(b))
    b = dict(a)
    del b["head.w"]
    with pytest.raises(BadInputError, match="'head.w' of the base"):
        check_compatible(MemoryReader(a), MemoryReader(b))
    b = dict(a)
    b["extra"] = torch.zeros(1)
    with pytest.raises(BadInputError, match="'extra' is not in the base"):
        check_compatible(MemoryReader(a), MemoryReader(b))


def test_safetensors_reader_is_lazy(tmp_path, monkeypatch):
    """Specs come from the header; a tensor is read only when asked for."""
    sd = {f"t{i}": torch.full((4,), float(i)) for i in range(5)}
    write_state_dict(sd, tmp_path / "m.safetensors")
    r = open_checkpoint(tmp_path / "m.safetensors")
    import safetensors

    calls = []
    real = safetensors.safe_open

    class Spy:
        def __init__(self, *a, **k):
            self.f = real(*a, **k)

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *e):
            return self.f.__exit__(*e)

        def get_tensor(self, name):
            calls.append(name)
            return self.f.get_tensor(name)

    monkeypatch.setattr(safetensors, "safe_open", Spy)
    assert torch.equal(r.get("t3"), sd["t3"])
    assert calls == ["t3"]


def test_readers_close(tmp_path):
    sd = _sd()
    torch.save(sd, tmp_path / "m.pt")
    with open_checkpoint(tmp_path / "m.pt") as r:
        assert not r.closed and _same(sd, r)
    assert r.closed
    with pytest.raises(KeyError):
        r.get("enc.w")  # a closed torch reader dropped its (memory-mapped) tensors


def test_empty_state_dict_is_a_clear_error(tmp_path):
    torch.save({"state_dict": {}}, tmp_path / "empty_sd.pt")
    with pytest.raises(BadInputError, match="empty_sd.pt: the state_dict holds no tensor"):
        open_checkpoint(tmp_path / "empty_sd.pt")


# --------------------------------------------------------------------------------------------- content, finiteness


def test_files_open_by_content_not_suffix(tmp_path):
    """A safetensors file under a .pt name opens; a torch file under a .safetensors name (torch.load reads
    that suffix as safetensors), a JSON file (the record next to a checkpoint) or unknown bytes under a
    torch name are clear errors."""
    sd = _sd()
    write_state_dict(sd, tmp_path / "st.safetensors")
    (tmp_path / "st_named.pt").write_bytes((tmp_path / "st.safetensors").read_bytes())
    torch.save(sd, tmp_path / "pt_named.safetensors")
    r = open_checkpoint(tmp_path / "st_named.pt")
    assert r.format == "safetensors" and _same(sd, r)
    (tmp_path / "junk.bin").write_bytes(b"junk" * 10)
    cases = {"st.safetensors.json": "a JSON file, not a checkpoint (the record written next to a checkpoint",
             "junk.bin": "not a torch checkpoint (neither a zip archive nor a pickle)",
             "pt_named.safetensors": "a torch checkpoint under a .safetensors name; rename it to .pt"}
    for name, msg in cases.items():
        with pytest.raises(BadInputError, match=re.escape(msg)):
            open_checkpoint(tmp_path / name)


def test_torch_refusals_say_why(tmp_path):
    """A code-carrying pickle names what torch's weights-only load met (not torch's paragraph about
    defaults); a truncated zip checkpoint says its archive is incomplete (was 'Invalid argument')."""
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"w": Evil()}, tmp_path / "evil_zip.pt")
    with pytest.raises(BadInputError, match=r"refused to load.*GLOBAL posix.system") as ei:
        open_checkpoint(tmp_path / "evil_zip.pt")
    assert "PyTorch 2.6" not in str(ei.value)
    torch.save(_sd(), tmp_path / "ok.pt")
    raw = (tmp_path / "ok.pt").read_bytes()
    (tmp_path / "trunc.pt").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(BadInputError, match=r"trunc.pt: corrupt or truncated torch checkpoint \(its zip archive"):
        open_checkpoint(tmp_path / "trunc.pt")


def test_all_finite_is_exact():
    """One sum decides when it is finite; an overflowing sum of finite values falls back to the exact test."""
    assert all_finite(torch.zeros(0)) and all_finite(torch.randn(100))
    for bad in (float("nan"), float("inf"), -float("inf")):
        for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
            t = torch.ones(50, dtype=dt)
            t[17] = bad
            assert not all_finite(t), (bad, dt)
            assert count_non_finite(t) == 1
    big = torch.full((1000,), 3e38)  # finite, but the float32 sum overflows
    assert all_finite(big) and all_finite(torch.full((10,), 60000.0, dtype=torch.float16))
    assert not all_finite(torch.tensor([1.0, float("nan")]).to(torch.float8_e5m2))
    assert all_finite(torch.ones(4).to(torch.float8_e4m3fn))


# ------------------------------------------------------------------ direct I/O, parts, the writer thread

def _big_sd(n_elems=(1, 4095, 2048, 3000, 0, 70001)):
    g = torch.Generator().manual_seed(3)
    sd = {f"t{i}": torch.randn(n, generator=g).to(torch.bfloat16) for i, n in enumerate(n_elems)}
    sd["f32"] = torch.randn(1234, generator=g)
    return sd


def _offsets(path) -> list:
    import struct

    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    header.pop("__metadata__", None)
    return sorted(header, key=lambda k: header[k]["data_offsets"][0])


def test_a_file_ending_in_its_largest_tensor_writes_it_first(tmp_path):
    """A safetensors file whose last tensor is its largest (or as large as the largest) writes it first, the others
    in order: every tensor reads back the same. Files ending otherwise, and torch files, keep the base's order."""
    g = torch.Generator().manual_seed(5)
    sd = {"embed": torch.randn(40, 8, generator=g).to(torch.bfloat16), "norm": torch.randn(8, generator=g),
          "layer.w": torch.randn(16, 8, generator=g).to(torch.bfloat16),
          "head": torch.randn(40, 8, generator=g).to(torch.bfloat16)}
    base = MemoryReader(sd, fmt="safetensors")
    order = list(base.keys())
    assert order[-1] == "head"
    for fmt, path in [("safetensors", tmp_path / "m.safetensors"), ("hf_safetensors", tmp_path / "hf")]:
        with CheckpointWriter(base, path, fmt=fmt) as w:
            assert w.order == ["head"] + order[:-1]
            for n in w.order:
                w.write(n, sd[n])
        got = open_checkpoint(path)
        assert _same(sd, got)
        assert _offsets(path if fmt == "safetensors" else path / "model.safetensors") == w.order
    assert CheckpointWriter(base, tmp_path / "t.pt", fmt="torch").order == order  # the order, nothing opened
    small_last = MemoryReader({k: sd[k] for k in ["embed", "layer.w", "head", "norm"]}, fmt="safetensors")
    assert CheckpointWriter(small_last, tmp_path / "s.safetensors").order == list(small_last.keys())
    shards = [["embed", "norm"], ["layer.w", "head"]]
    write_state_dict(sd, tmp_path / "sh", fmt="hf_safetensors", shards=shards)
    sharded = open_checkpoint(tmp_path / "sh")
    with CheckpointWriter(sharded, tmp_path / "sh2", fmt="hf_safetensors") as w:
        assert w.order == ["embed", "norm", "head", "layer.w"]
        for n in w.order:
            w.write(n, sd[n])
    assert _same(sd, open_checkpoint(tmp_path / "sh2"))


@pytest.mark.parametrize("stage", [4096, 8192, 1 << 20])
def test_direct_io_output_is_byte_identical(tmp_path, monkeypatch, stage):
    """O_DIRECT (every size here, staging buffers that fill mid-tensor and a tail that is not a whole block) writes
    exactly the bytes the page-cache path writes."""
    from icmltools.taskvec import writers

    sd = _big_sd()
    write_state_dict(sd, tmp_path / "plain.safetensors")
    opened = []
    real = writers._DirectFile

    def spy(path):
        f = real(path)
        opened.append(f)
        return f

    monkeypatch.setattr(writers, "DIRECT_MIN_BYTES", 0)
    monkeypatch.setattr(writers, "_STAGE", stage)
    monkeypatch.setattr(writers, "_DirectFile", spy)
    write_state_dict(sd, tmp_path / "direct.safetensors")
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this OS")
    assert opened, "the direct path was not taken"
    assert (tmp_path / "direct.safetensors").read_bytes() == (tmp_path / "plain.safetensors").read_bytes()
    assert _same(sd, open_checkpoint(tmp_path / "direct.safetensors"))


def _header_offsets(path) -> dict:
    import struct

    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    header.pop("__metadata__", None)
    return {k: 8 + n + v["data_offsets"][0] for k, v in header.items()}


def _placed(t, at: int, block: int = 4096):
    """A copy of the flat tensor t whose address is congruent to `at` modulo a block where its dtype's size allows
    (as the merge engine places its output chunks)."""
    size = t.element_size()
    buf = torch.empty(t.numel() + block // size, dtype=t.dtype)
    gap = (at - buf.data_ptr()) % block
    shift = gap // size if gap % size == 0 else 0
    out = buf[shift:shift + t.numel()]
    out.copy_(t)
    return out


@pytest.mark.parametrize("stage", [8192, 1 << 20])
@pytest.mark.parametrize("fmt", ["safetensors", "hf_safetensors"])
def test_direct_io_writes_parts_placed_at_their_offset_from_their_own_buffers(tmp_path, monkeypatch, stage, fmt):
    """byte_offset names where each element lands in its file (the header's offsets, shards included); parts whose
    address is congruent to it modulo a block go to the disk from their own buffers, whole blocks, the bytes before
    the first block boundary and after the last one through the staging buffer; parts placed anywhere else are all
    staged. Either way the file is byte for byte the page-cache path's."""
    from icmltools.taskvec import writers

    g = torch.Generator().manual_seed(5)
    sd = {"a": torch.randn(70002, generator=g).to(torch.bfloat16), "b": torch.randn(3, generator=g),
          "c": torch.randn(40000, generator=g), "e": torch.randn(5, generator=g).to(torch.bfloat16),
          "f": torch.randn(1000, generator=g), "d": torch.randn(90000, generator=g).to(torch.bfloat16)}
    # f lands 2 bytes past a multiple of 4 in its file: no float32 view there, staged whole
    shards = [["a", "b", "e", "f"], ["c", "d"]] if fmt == "hf_safetensors" else None
    src = tmp_path / "src"
    write_state_dict(sd, src, fmt="hf_safetensors", shards=shards) if shards else None
    base = open_checkpoint(src) if shards else MemoryReader(sd, fmt="safetensors")
    plain = tmp_path / "plain"
    with CheckpointWriter(base, plain, fmt=fmt) as w:
        for n in w.order:
            w.write(n, sd[n])
    files = (lambda root: sorted(root.glob("*.safetensors")) if root.is_dir() else [root])
    assert CheckpointWriter(base, tmp_path / "x.pt", fmt="torch").byte_offset("a") is None
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this OS")
    monkeypatch.setattr(writers, "DIRECT_MIN_BYTES", 0)
    monkeypatch.setattr(writers, "_STAGE", stage)
    monkeypatch.setattr(writers, "_DIRECT_MIN", 4096)
    staged = []
    real_stage = writers._DirectFile._stage
    monkeypatch.setattr(writers._DirectFile, "_stage", lambda self, mv: (staged.append(len(mv)), real_stage(self, mv)))
    total = sum(t.numel() * t.element_size() for t in sd.values())
    for placed in (True, False):
        staged.clear()
        out = tmp_path / f"out_{placed}"
        with CheckpointWriter(base, out, fmt=fmt) as w:
            for n in w.order:
                t = sd[n].reshape(-1)
                for a in range(0, t.numel(), 30011):
                    b = min(t.numel(), a + 30011)
                    at = w.byte_offset(n, a) + (0 if placed else 2 * t.element_size())
                    w.write_range(n, a, b, _placed(t[a:b], at))
        for f in files(out):
            offs = _header_offsets(f)
            assert {k: w.byte_offset(k) for k in offs} == offs
        assert [f.read_bytes() for f in files(out)] == [f.read_bytes() for f in files(plain)]
        assert _same(sd, open_checkpoint(out))
        assert (sum(staged) < total // 4) if placed else (sum(staged) >= total)  # headers are staged too


def test_direct_io_refused_falls_back_to_the_page_cache(tmp_path, monkeypatch):
    from icmltools.taskvec import writers

    def refuse(path):
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(writers, "DIRECT_MIN_BYTES", 0)
    monkeypatch.setattr(writers, "_DirectFile", refuse)
    sd = _big_sd()
    write_state_dict(sd, tmp_path / "m.safetensors")
    assert _same(sd, open_checkpoint(tmp_path / "m.safetensors"))


@pytest.mark.parametrize("fmt", ["safetensors", "torch", "hf_safetensors"])
def test_write_range_parts_equal_whole_tensors(tmp_path, fmt):
    """Tensors written in parts (any split, in order) give the file written whole; out-of-order parts refused."""
    sd = _big_sd()
    base = MemoryReader(sd, fmt="safetensors")
    write_state_dict(sd, tmp_path / "whole", fmt=fmt)
    with CheckpointWriter(base, tmp_path / "parts", fmt=fmt) as w:
        for name in w.order:
            t = sd[name].reshape(-1)
            cuts = sorted({0, t.numel(), *range(0, t.numel(), 997)})
            if t.numel() == 0:
                w.write_range(name, 0, 0, t)
            for a, b in zip(cuts, cuts[1:]):
                w.write_range(name, a, b, t[a:b].clone())
    assert _same(sd, open_checkpoint(tmp_path / "parts"))
    with pytest.raises(RuntimeError, match="part at element"):
        with CheckpointWriter(base, tmp_path / "bad.safetensors") as w:
            name = w.order[1]
            w.write_range(w.order[0], 0, sd[w.order[0]].numel(), sd[w.order[0]].reshape(-1))
            w.write_range(name, 1, 2, sd[name].reshape(-1)[1:2])
    assert not (tmp_path / "bad.safetensors").exists()


def test_write_behind_writes_in_order_and_reuses_slots(tmp_path):
    from icmltools.taskvec import WriteBehind

    sd = _big_sd()
    base = MemoryReader(sd, fmt="safetensors")
    bufs = [torch.empty(70001, dtype=torch.bfloat16) for _ in range(2)]
    with CheckpointWriter(base, tmp_path / "m.safetensors") as cw, WriteBehind(cw, slots=2) as w:
        for name in w.order:
            t = sd[name].reshape(-1)
            if t.dtype != torch.bfloat16 or t.numel() == 0:
                w.write(name, sd[name])
                continue
            for a in range(0, t.numel(), 1000):
                b = min(t.numel(), a + 1000)
                s = w.slot()
                buf = bufs[s][: b - a]
                buf.copy_(t[a:b])  # the slot is free: its last write is done
                w.write_range(name, a, b, buf, s)
    assert _same(sd, open_checkpoint(tmp_path / "m.safetensors"))


def test_write_behind_takes_a_free_slot_that_fits():
    """slot(fits) takes the first free slot (in turn from the next one) that fits, leaving the turn where it
    was; a slot whose write is still running, or handed out and not yet written, is passed over however well it
    fits, and with none free that fits the turn's slot is taken (waiting for its write) as without `fits`."""
    import threading

    from icmltools.taskvec import WriteBehind

    gate, wrote = threading.Event(), []

    class Slow:  # a writer whose writes wait for the gate
        order: list = []

        def write_range(self, name, a, b, part):
            gate.wait(10)
            wrote.append(name)

    with WriteBehind(Slow(), slots=3) as w:
        assert w.slot(lambda j: j == 2) == 2  # free and fits: taken out of turn, the turn left at 0
        assert w.slot(lambda j: j == 2) == 0  # 2 handed out, its write not yet submitted: the turn's
        w.write_range("a", 0, 1, None, 0)  # slots 0 and 2 busy until the gate opens
        w.write_range("b", 0, 1, None, 2)
        assert w.slot(lambda j: j in (0, 2)) == 1  # both busy: passed over; the turn's (1), free
        assert not wrote
        gate.set()
        assert w.slot() == 2  # the turn's: its write waited for ("a" ran before it)
        assert w.slot(lambda j: j == 0) == 0  # done, and it fits
    assert wrote == ["a", "b"]


def test_write_behind_takes_the_smallest_free_slot_that_fits():
    """With sizes from `fits` (0: does not fit), the smallest free buffer that fits is taken, the first in turn
    among equals, so a small chunk leaves a large buffer free for the next large tensor (first fit put it there,
    and a large tensor that came while that write ran grew another buffer); a busy slot is passed over however
    small; with none free that fits, the turn's."""
    import threading

    from icmltools.taskvec import WriteBehind

    gate = threading.Event()

    class Slow:
        order: list = []

        def write_range(self, name, a, b, part):
            gate.wait(10)

    sizes = {0: 0, 1: 900, 2: 40, 3: 40}
    with WriteBehind(Slow(), slots=4) as w:
        assert w.slot(sizes.get) == 2  # 2 and 3 equal and smallest: the first in turn; the turn left at 0
        w.write_range("a", 0, 1, None, 2)  # 2 busy until the gate opens
        assert w.slot(sizes.get) == 3  # 2 busy: the next smallest, not the large 1
        assert w.slot({0: 0, 1: 900, 2: 40, 3: 0}.get) == 1  # 2 busy, 3 handed out: the large one
        assert w.slot(lambda j: 0) == 0  # none fits: the turn's
        gate.set()


def test_write_behind_error_in_the_thread_leaves_nothing(tmp_path):
    """The thread's first error is raised in the caller, and the writer's exit removes the temporary output."""
    from icmltools.taskvec import WriteBehind

    sd = _big_sd()
    base = MemoryReader(sd, fmt="safetensors")
    out = tmp_path / "m.safetensors"
    with pytest.raises(RuntimeError, match="expected tensor"):
        with CheckpointWriter(base, out) as cw, WriteBehind(cw) as w:
            w.write(w.order[1], sd[w.order[1]])  # out of order: refused in the thread
            for name in w.order:
                w.write(name, sd[name])
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_write_behind_interrupt_leaves_nothing(tmp_path):
    from icmltools.taskvec import WriteBehind

    sd = _big_sd()
    base = MemoryReader(sd, fmt="safetensors")
    out = tmp_path / "m.safetensors"
    with pytest.raises(KeyboardInterrupt):
        with CheckpointWriter(base, out) as cw, WriteBehind(cw) as w:
            w.write(w.order[0], sd[w.order[0]])
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_retyped_config_names_the_output_dtype(tmp_path):
    """config.json of a retyped HF output: the dtype keys present (transformers 5's `dtype`, older `torch_dtype`)
    name the output dtype, `torch_dtype` added when neither is there; a config that is not a JSON object is copied."""
    import json

    from icmltools.taskvec.writers import _retyped_config

    cases = [({"dtype": "float32", "x": 1}, {"dtype": "bfloat16", "x": 1}),
             ({"torch_dtype": "float32", "dtype": "float32"}, {"torch_dtype": "bfloat16", "dtype": "bfloat16"}),
             ({"x": [1]}, {"x": [1], "torch_dtype": "bfloat16"})]
    for i, (src, want) in enumerate(cases):
        (tmp_path / f"c{i}.json").write_text(json.dumps(src))
        _retyped_config(tmp_path / f"c{i}.json", tmp_path / f"o{i}.json", torch.bfloat16)
        assert json.loads((tmp_path / f"o{i}.json").read_text()) == want
    for i, raw in enumerate(("[1, 2]", "not json")):
        (tmp_path / f"b{i}.json").write_text(raw)
        _retyped_config(tmp_path / f"b{i}.json", tmp_path / f"p{i}.json", torch.float16)
        assert (tmp_path / f"p{i}.json").read_text() == raw
