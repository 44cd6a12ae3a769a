"""Restricted loading and validation of memory snapshot pickles."""

import os
import pickle
import random

import pytest

import snapshot_factory as sf
from loom.tools import snapshot
from loom.tools.snapshot import SnapshotError


class Custom:  # pickled by reference to its class: must be refused
    def __init__(self):
        self.x = 1


def _small():
    return sf.snapshot(
        [[sf.entry("alloc", 0x1000, 100),
          sf.entry("free_requested", 0x1000, 100),
          sf.entry("free_completed", 0x1000, 100),
          sf.entry("segment_alloc", 0x1000, 2 << 20)]],
        [sf.segment(0x1000, [sf.block(0x1000, 512, "active_allocated", 100),
                             sf.block(0x1200, 512, "inactive")])])


def _load(data):
    return snapshot.loads_snapshot(data, "snap.pickle")


def test_valid_snapshot_loads_as_plain_data():
    loaded = _load(sf.dumps(_small()))
    assert loaded["device_traces"][0][0]["addr"] == 0x1000
    assert loaded["segments"][0]["segment_pool_id"] == (0, 0)


def test_global_is_refused_and_never_called(tmp_path):
    marker = tmp_path / "ran"
    # A classic payload: os.system("touch ran") via REDUCE.
    payload = pickle.dumps(_Payload(str(marker)), protocol=4)
    with pytest.raises(SnapshotError) as error:
        _load(payload)
    assert str(error.value).startswith("snap.pickle: refused global "
                                       "'posix.system'")
    assert not marker.exists()
    with pytest.raises(SnapshotError, match=r"refused global 'posix\.system'"):
        _load(pickle.dumps(os.system, protocol=2))


class _Payload:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_custom_class_is_refused():
    with pytest.raises(SnapshotError,
                       match=r"^snap\.pickle: refused global '.*Custom'"):
        _load(pickle.dumps({"device_traces": [Custom()], "segments": []},
                           protocol=4))


def test_persistent_id_is_refused():
    import io

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            return "tensor-17" if obj == "secret" else None

    out = io.BytesIO()
    Pickler(out, protocol=4).dump({"device_traces": ["secret"]})
    with pytest.raises(SnapshotError, match="refused persistent id "
                       "'tensor-17'"):
        _load(out.getvalue())


@pytest.mark.parametrize("obj,opcode", [
    ({"device_traces": [], "segments": [], "x": {1, 2}}, "EMPTY_SET"),
    ({"x": frozenset([1])}, "FROZENSET"),
    ({"x": bytearray(b"ab")}, "BYTEARRAY8"),
])
def test_non_plain_objects_are_refused(obj, opcode):
    with pytest.raises(SnapshotError, match=f"refused pickle opcode {opcode}"):
        _load(pickle.dumps(obj, protocol=5))


def test_memo_bomb_is_harmless():
    # LONG_BINPUT with index 2^31: the C unpickler would grow its memo array
    # to 2^32 entries (32 GiB); the restricted one uses a dict.
    with pytest.raises(SnapshotError, match="top level is NoneType"):
        _load(b"\x80\x04Nr\x00\x00\x00\x80.")


@pytest.mark.parametrize("data,message", [
    (b"", "snap.pickle: empty file, not a memory snapshot"),
    (b"hello world\n", "snap.pickle: not a memory snapshot: it does not start "
     "with a pickle protocol header (0x80 and a protocol 2..5)"),
    (pickle.dumps({"a": 1}, protocol=0), "snap.pickle: not a memory snapshot"
     ": it does not start with a pickle protocol header"),
    (b"\x80\x04", "snap.pickle: not a readable pickle: the data ends early "
     "(truncated file)"),
    (b"\x80\x04\xff", "snap.pickle: not a readable pickle: invalid opcode "
     "byte 0xff"),
    (b"\x80\x04h\x05.", "snap.pickle: not a readable pickle: Memo value not "
     "found at index 5"),
    (sf.dumps(_small()) + b"junk", "snap.pickle: 4 unexpected bytes after "
     "the end of the pickle"),
])
def test_unreadable_files(data, message):
    with pytest.raises(SnapshotError) as error:
        _load(data)
    assert str(error.value).startswith(message)


def test_truncated_at_every_length():
    data = sf.dumps(_small())
    for length in range(len(data)):
        with pytest.raises(SnapshotError, match=r"^snap\.pickle: "):
            _load(data[:length])


def test_random_corruption_never_escapes_as_another_exception():
    data = sf.dumps(_small())
    rng = random.Random(1234)
    outcomes = {"loaded": 0, "refused": 0}
    for _ in range(3000):
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            choice = rng.random()
            at = rng.randrange(len(mutated))
            if choice < 0.5:
                mutated[at] ^= 1 << rng.randrange(8)
            elif choice < 0.7:
                mutated[at] = rng.randrange(256)
            elif choice < 0.85:
                del mutated[at]
            else:
                mutated.insert(at, rng.randrange(256))
        try:
            _load(bytes(mutated))
            outcomes["loaded"] += 1
        except SnapshotError as error:
            assert str(error).startswith("snap.pickle: ")
            outcomes["refused"] += 1
    assert outcomes["refused"] > 1000


def _with(mutate):
    snap = _small()
    mutate(snap)
    return sf.dumps(snap)


def _set_entry(key, value):
    return lambda s: s["device_traces"][0][1].__setitem__(key, value)


@pytest.mark.parametrize("data,message", [
    (sf.dumps([1, 2]), "snap.pickle: top level is list [1, 2], expected a "
     "dict with 'device_traces' and 'segments' (a torch.cuda.memory."
     "_snapshot())"),
    (_with(lambda s: s.pop("device_traces")), "snap.pickle: top level: "
     "missing key 'device_traces'"),
    (_with(lambda s: s.pop("segments")), "snap.pickle: top level: missing "
     "key 'segments'"),
    (_with(lambda s: s.__setitem__("segments", {})), "snap.pickle: top level:"
     " 'segments' is dict {}, expected a list"),
    (_with(lambda s: s["device_traces"].__setitem__(0, (1,))), "snap.pickle: "
     "device_traces[0]: is tuple (1,), expected a list of entries"),
    (_with(lambda s: s["device_traces"][0].__setitem__(2, "x")),
     "snap.pickle: device_traces[0][2]: trace entry is str 'x', expected a "
     "dict"),
    (_with(lambda s: s["device_traces"][0][1].pop("action")), "snap.pickle: "
     "device_traces[0][1]: missing key 'action'"),
    (_with(_set_entry("action", 7)), "snap.pickle: device_traces[0][1]: "
     "'action' is int 7, expected a string"),
    (_with(lambda s: s["device_traces"][0][1].pop("addr")), "snap.pickle: "
     "device_traces[0][1]: missing key 'addr'"),
    (_with(_set_entry("addr", "0x10")), "snap.pickle: device_traces[0][1]: "
     "'addr' is str '0x10', expected an integer"),
    (_with(_set_entry("addr", -1)), "snap.pickle: device_traces[0][1]: "
     "'addr' is -1, outside 0..18446744073709551615"),
    (_with(_set_entry("size", -5)), "snap.pickle: device_traces[0][1]: "
     "'size' is -5, outside 0..1125899906842624"),
    (_with(_set_entry("size", 1 << 60)), "snap.pickle: device_traces[0][1]: "
     "'size' is 1152921504606846976, outside 0..1125899906842624"),
    (_with(_set_entry("size", True)), "snap.pickle: device_traces[0][1]: "
     "'size' is bool True, expected an integer"),
    (_with(_set_entry("size", 1.5)), "snap.pickle: device_traces[0][1]: "
     "'size' is float 1.5, expected an integer"),
    (_with(_set_entry("stream", None)), "snap.pickle: device_traces[0][1]: "
     "'stream' is NoneType None, expected an integer"),
    (_with(lambda s: s["device_traces"][0][3].__setitem__("size", "big")),
     "snap.pickle: device_traces[0][3]: 'size' is str 'big', expected an "
     "integer"),
    (_with(lambda s: s["segments"].append(3)), "snap.pickle: segments[1]: "
     "is int 3, expected a dict"),
    (_with(lambda s: s["segments"][0].pop("device")), "snap.pickle: "
     "segments[0]: missing key 'device'"),
    (_with(lambda s: s["segments"][0].__setitem__("device", 40000)),
     "snap.pickle: segments[0]: 'device' is 40000, outside 0..32767"),
    (_with(lambda s: s["segments"][0].pop("blocks")), "snap.pickle: "
     "segments[0]: missing key 'blocks'"),
    (_with(lambda s: s["segments"][0]["blocks"][1].pop("state")),
     "snap.pickle: segments[0].blocks[1]: missing key 'state'"),
    (_with(lambda s: s["segments"][0]["blocks"][0].__setitem__("size", "1")),
     "snap.pickle: segments[0].blocks[0]: 'size' is str '1', expected an "
     "integer"),
])
def test_structure_errors_name_the_place(data, message):
    with pytest.raises(SnapshotError) as error:
        _load(data)
    assert str(error.value) == message


def test_legacy_blocks_get_addresses_and_requested_sizes():
    snap = _small()
    for block in snap["segments"][0]["blocks"]:
        del block["address"]
        del block["requested_size"]
    loaded = _load(sf.dumps(snap))
    blocks = loaded["segments"][0]["blocks"]
    assert [(b["address"], b["requested_size"]) for b in blocks] == [
        (0x1000, 512), (0x1200, 512)]
    assert snapshot.active_blocks(loaded, 0) == [(0x1000, 512, 0)]
    assert snapshot.active_blocks(loaded, 1) == []


def test_is_snapshot_file_by_content(tmp_path):
    named_ltt = sf.write(tmp_path / "really_a_snapshot.ltt", _small())
    assert snapshot.is_snapshot_file(named_ltt)
    text = tmp_path / "x.pickle"
    text.write_text("loom-trace 1\n")
    assert not snapshot.is_snapshot_file(text)
    assert not snapshot.is_snapshot_file(tmp_path / "missing")
    assert not snapshot.is_snapshot_file(tmp_path)


def test_load_snapshot_names_missing_file(tmp_path):
    with pytest.raises(SnapshotError, match="nope.pickle: cannot read"):
        snapshot.load_snapshot(tmp_path / "nope.pickle")
