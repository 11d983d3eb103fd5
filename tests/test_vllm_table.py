"""analysis.vllm_table: the batch-to-k table vLLM's speculative config reads, from a sweep's summaries."""

from __future__ import annotations

import json

from analysis import vllm_table


def write_run(sweep, name, batch_size, k, speedup, draft_length="fixed", status="complete"):
    run = sweep / name
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({
        "status": status, "draft_length": draft_length, "k": k, "batch_size": batch_size,
        "pooled": {"speedup": {"value": speedup}}}))


def test_the_table_loads_as_vllms_list_contiguous_with_k_zero_where_speculation_does_not_pay(tmp_path, capsys):
    measured = {(1, 2): 1.3, (1, 4): 1.5, (4, 2): 1.2, (4, 4): 1.25, (16, 1): 0.98, (16, 2): 0.95,
                (64, 1): 0.9, (64, 4): 0.7}
    for index, ((batch_size, k), speedup) in enumerate(measured.items()):
        write_run(tmp_path, str(index), batch_size, k, speedup)
    write_run(tmp_path, "policy", 16, 8, 1.9, draft_length="cost_optimal")  # not a fixed k: ignored
    write_run(tmp_path, "killed", 64, 2, 3.0, status="running")  # unfinished: ignored
    vllm_table.main([str(tmp_path)])
    table = json.loads((tmp_path / vllm_table.OUTPUT).read_text())
    assert isinstance(table, list) and all(isinstance(entry, list) and len(entry) == 3 for entry in table)
    assert all(isinstance(value, int) for entry in table for value in entry)
    assert table[0][0] == 1 and table[-1][1] == 64
    assert all(after[0] == before[1] + 1 for before, after in zip(table, table[1:]))  # contiguous
    assert table == [[1, 15, 4], [16, 64, 0]]  # neighbours with the same k merged; k = 0 where the best < 1
    assert "batch 16: k = 0" in capsys.readouterr().out


def test_ranges_hold_each_measured_k_until_the_next_batch_size():
    assert vllm_table.batch_ranges({1: 5, 2: 3, 8: 3, 32: 0}) == [[1, 1, 5], [2, 31, 3], [32, 32, 0]]


def test_the_table_from_a_load_bench_result_takes_its_fastest_fixed_k_at_the_temperature_asked(tmp_path):
    rows = [{"batch": batch, "T": temperature, "policy": policy, "speedup": speedup}
            for batch, temperature, policy, speedup in [
                (1, 0.0, "plain", 1.0), (1, 0.0, "k=2", 1.4), (1, 0.0, "k=4", 1.6), (1, 0.0, "cost_optimal", 1.9),
                (1, 1.0, "plain", 1.0), (1, 1.0, "k=2", 1.3), (1, 1.0, "k=4", 1.1),
                (16, 0.0, "plain", 1.0), (16, 0.0, "k=2", 0.97), (16, 0.0, "heuristic", 1.2),
                (16, 1.0, "plain", 1.0), (16, 1.0, "k=2", 1.05)]]
    bench = tmp_path / "load_bench.json"
    bench.write_text(json.dumps({"rows": rows, "verdicts": []}))
    vllm_table.main([str(bench)])
    assert json.loads((tmp_path / vllm_table.OUTPUT).read_text()) == [[1, 15, 4], [16, 16, 0]]
    vllm_table.main([str(bench), "--temperature", "1"])
    assert json.loads((tmp_path / vllm_table.OUTPUT).read_text()) == [[1, 16, 2]]
