"""``fedgat bench overhead`` on a tiny synthetic setting: the JSON, Markdown and plot it writes."""

import json

from fedgat import cli

REQUIRED = {"plaintext", "encrypted", "ratios", "slot_utilisation", "op_bound"}
RATIOS = {"time", "bytes", "memory", "server_vs_op_bound"}
PHASES = {"keygen", "encrypt", "upload", "server_compute", "download", "decrypt", "round"}


def test_bench_overhead_json_has_required_keys(tmp_path, capsys):
    out = tmp_path / "res"
    path = tmp_path / "o.json"
    status = cli.main(["bench", "overhead", "--dataset", "synthetic", "--nodes", "60", "--clients", "2",
                       "--workers", "0", "--no-train", "--out", str(out), "--json", str(path)])
    assert status == 0
    data = json.loads(path.read_text())
    assert REQUIRED <= set(data)
    assert RATIOS <= set(data["ratios"])
    for side in ("plaintext", "encrypted"):
        assert PHASES <= set(data[side]["phases"])
        assert all({"wall", "cpu"} <= set(v) for v in data[side]["phases"].values())
        assert data[side]["bytes_up"] > 0 and data[side]["bytes_down"] > 0
    enc = data["encrypted"]
    assert enc["ciphertexts_up"] > 0 and enc["multiply_adds"] > 0 and not enc["server_has_secret_key"]
    assert 0 < enc["max_abs_error"] < 1e-5
    assert data["ratios"]["bytes"] > 1 and data["ratios"]["server_vs_op_bound"] > 0
    assert enc["server_compute_alone"] > 0 and data["ratios"]["server_alone_vs_op_bound"] > 0
    bound = data["op_bound"]
    assert bound["server_seconds"] > 0 and bound["server_seconds_alone_cost"] > 0
    # one server core here: the busy cost is one process's, timed apart from the alone cost
    assert len(bound["seconds_per_multiply_add_busy_per_process"]) == bound["server_cores_used"] == 1
    assert bound["seconds_per_multiply_add"] > 0 and bound["seconds_per_multiply_add_one_core_alone"] > 0
    assert 0 < data["slot_utilisation"]["nominal"] <= 1
    assert (out / "overhead.md").read_text().count("FedGraph") == 1
    assert (out / "overhead.png").stat().st_size > 0
    assert "op bound" in capsys.readouterr().out
