"""Recording without arithmetic (loom.tools.fake_record, the CPU
recorder's default mode) on the real torch and transformers: fake storages
give the same requests and frees as real ones, a model's step records the
same trace on FakeTensors as with the arithmetic, cuBLAS's workspaces, the
optimizer path CUDA takes, and what a fake step cannot do."""

import pytest
import torch

import loom
from loom.tools import cpu_models
from loom.tools import fake_record
from loom.tools import record_cpu_cli
from loom.tools import trace as loom_trace

WORKSPACE = fake_record.CUBLAS_WORKSPACE_BYTES


def _allocs(rec):
    return [e.size for e in rec.events if e.kind == loom_trace.ALLOC]


def test_fake_storages_are_requests_views_and_frees_as_real_ones():
    def ops():
        a = torch.empty(1000)                        # 4000 B
        view = a.view(10, 100)                       # a view: nothing
        half = torch.zeros(3, dtype=torch.float16)   # 6 B
        odd = a[::2].clone()                         # 2000 B
        del odd                                      # its free
        b = a * 2                                    # 4000 B
        del a
        del view                                     # a's last view: free
        return half, b

    traces = []
    for real in (True, False):
        with loom.record_cpu(real=real) as rec:
            kept = ops()
            if not real:
                assert fake_record.is_fake(kept[1])
                assert rec.request_of(kept[1]) == 4
            del kept
        traces.append([(e.kind, e.id, e.size) for e in rec.events])
    assert traces[0] == traces[1] == [
        ("alloc", 1, 4000), ("alloc", 2, 6), ("alloc", 3, 2000),
        ("free", 3, 0), ("alloc", 4, 4000), ("free", 1, 0), ("free", 2, 0),
        ("free", 4, 0)]


def test_a_model_step_records_the_same_trace_without_arithmetic():
    """A tiny llama, bf16 autocast (CUDA's policy), AdamW: the fake
    recording is the real one, request for request, apart from cuBLAS's
    workspaces (only the fake mode records them by default)."""
    traces = {}
    for real in (True, False):
        spec = cpu_models.StepSpec("llama", real=real, dtype="bf16")
        rec = record_cpu_cli.record_steps(spec, 2)
        traces[real] = [(e.kind, e.size, e.name) for e in rec.events]
    fake = traces[False]
    workspaces = [i for i, e in enumerate(fake) if e == ("alloc", WORKSPACE,
                                                          "")]
    assert len(workspaces) == 2
    assert [e for i, e in enumerate(fake) if i not in workspaces] == \
        traces[True]


def test_cublas_workspaces_one_per_thread_never_freed():
    with fake_record.building():
        model = torch.nn.Linear(64, 64)
    with loom.record_cpu(model=model) as rec:
        x = torch.randn(8, 64)
        model(x).sum().backward()
        model(x).sum().backward()                    # none more
    sizes = _allocs(rec)
    assert sizes.count(WORKSPACE) == 2
    ids = [e.id for e in rec.events
           if e.kind == loom_trace.ALLOC and e.size == WORKSPACE]
    freed = {e.id for e in rec.events if e.kind == loom_trace.FREE}
    assert not set(ids) & freed
    # the forward's comes after its first matmul's result
    forward = next(i for i, e in enumerate(rec.events)
                   if e.kind == loom_trace.PHASE and e.name == "forward")
    first = next(i for i, e in enumerate(rec.events)
                 if i > forward and e.kind == loom_trace.ALLOC)
    assert rec.events[first].size == 8 * 64 * 4     # addmm's result
    assert rec.events[first + 1].size == WORKSPACE
    with loom.record_cpu(cuda_workspaces=False) as off:
        model(x).sum().backward()
    assert WORKSPACE not in _allocs(off)


def test_the_optimizer_takes_cuda_s_path():
    with fake_record.building():
        model = torch.nn.Linear(4, 4)
        left_open = torch.optim.AdamW(model.parameters())
        chosen = torch.optim.AdamW(model.parameters(), foreach=False)
    assert fake_record.cuda_optimizer(left_open) == 1
    assert left_open.param_groups[0]["foreach"] is True
    assert fake_record.cuda_optimizer(chosen) == 0
    assert chosen.param_groups[0]["foreach"] is False


def test_host_values_have_no_data():
    with fake_record.building():
        flag = torch.zeros(3).eq(0).all()
        count = torch.zeros((), dtype=torch.long)
        loss = torch.zeros(())
    with loom.record_cpu():
        assert bool(flag) is True
        assert count.item() == 1 and loss.item() == 1.0


def test_grouped_mm_in_float32_as_cuda_takes_it():
    with fake_record.building():
        tokens = torch.randn(64, 32)
        weight = torch.randn(4, 32, 48)
        offsets = torch.tensor([16, 32, 48, 64], dtype=torch.int32)
    with loom.record_cpu() as rec:
        out = torch._grouped_mm(tokens, weight, offs=offsets)  # noqa: SLF001
    assert out.shape == (64, 48) and out.dtype == torch.float32
    assert _allocs(rec) == [64 * 48 * 4]


def test_no_cuda_workspaces_makes_a_fake_recording_the_real_one(tmp_path):
    """`loom record-cpu --no-cuda-workspaces`: the FakeTensor trace is the
    --real one, request for request (how a corpus recorded with --real is
    extended without the arithmetic: bench/data/recorded/regenerate.sh)."""
    traces = {}
    for extra in (["--real"], ["--no-cuda-workspaces"], []):
        out = tmp_path / f"step{len(traces)}.ltb"
        assert record_cpu_cli.main(["--model", "llama", "--dtype", "bf16",
                                    "--steps", "2", *extra, "-o",
                                    str(out)]) == 0
        traces[" ".join(extra)] = [
            (e.kind, e.size, e.name)
            for e in loom_trace.read_trace(str(out)).events]
    assert traces["--no-cuda-workspaces"] == traces["--real"]
    assert len(traces[""]) == len(traces["--real"]) + 2  # the workspaces
    args = record_cpu_cli.parser().parse_args(
        ["--model", "llama", "--no-cuda-workspaces", "-o", "x.ltb"])
    assert record_cpu_cli.spec_from_args(args).cuda_workspaces is False


def test_a_data_dependent_step_says_to_record_with_real(tmp_path, capsys):
    status = record_cpu_cli.main(["--model", "mixtral", "--experts",
                                  "eager", "--steps", "1", "-o",
                                  str(tmp_path / "moe.ltb")])
    assert status == 1
    message = capsys.readouterr().err.strip()
    assert len(message.splitlines()) == 1
    assert "record with --real" in message
    assert not (tmp_path / "moe.ltb").exists()


@pytest.mark.parametrize("argv,full", [([], True), (["--tiny"], False)])
def test_what_if_defaults_to_the_model_s_own_size(argv, full):
    # pylint: disable-next=import-outside-toplevel
    from loom.tools import whatif
    args = whatif.parser().parse_args(["--model", "llama", *argv])
    assert record_cpu_cli.spec_from_args(args).tiny is not full
    args = record_cpu_cli.parser().parse_args(["--model", "llama", "-o",
                                               "x.ltb"])
    assert record_cpu_cli.spec_from_args(args).tiny  # record-cpu: tiny


def test_a_float32_grouped_mm_records_its_result_only():
    """CUDA's _grouped_mm takes float32 (a cuBLAS mm per group into the
    result): a transposed first operand (an expert weight's gradient) is
    no copy (the H200's MoE trace: what looked like one was transformers
    5.17's masked_fill of the gradient)."""
    with fake_record.building():
        grad = torch.randn(64, 48)
        tokens = torch.randn(64, 32)
        offsets = torch.tensor([16, 32, 48, 64], dtype=torch.int32)
    with loom.record_cpu() as rec:
        out = torch._grouped_mm(grad.t(), tokens, offs=offsets)  # noqa: SLF001
    assert out.shape == (4, 48, 32) and out.dtype == torch.float32
    assert [(e.kind, e.size) for e in rec.events] == [
        ("alloc", 4 * 48 * 32 * 4)]


def test_the_backward_of_indexing_puts_the_gradient_in_place():
    """autograd's backward of x[idx] puts the gradient into zeros it makes
    in place on CUDA; a dispatch mode (the recorder's) would make it copy
    them. An index_put of the program's own stays out of place."""
    with fake_record.building():
        x = torch.randn(64, 32, requires_grad=True)
        idx = torch.arange(128) // 2
    with loom.record_cpu() as rec:
        x[idx].sum().backward()
        mine = torch.zeros(64, 32).index_put((idx,), torch.ones(128, 32),
                                             True)
    assert x.grad.shape == mine.shape == (64, 32)
    assert _allocs(rec) == [128 * 32 * 4, 4,   # x[idx], its sum
                            4, 64 * 32 * 4,    # ones, the zeros (x.grad)
                            64 * 32 * 4, 128 * 32 * 4,  # zeros, ones
                            64 * 32 * 4]       # index_put: a copy
