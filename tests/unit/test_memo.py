from __future__ import annotations

import json
import math

from resfl_lightning.memo import disk_memo


def test_disk_memo_computes_once_per_key_and_reads_back_exactly(tmp_path):
    calls = []

    def compute(v):
        calls.append(v)
        return v

    x = 0.1 + 0.2  # not representable in short decimal: the stored value must round-trip exactly
    assert disk_memo("ns", {"a": 1}, lambda: compute(x), root=tmp_path) == x
    assert disk_memo("ns", {"a": 1}, lambda: compute(-1.0), root=tmp_path) == x  # read back, not recomputed
    assert disk_memo("ns", {"a": 2}, lambda: compute(7.0), root=tmp_path) == 7.0  # another key, another value
    assert disk_memo("other", {"a": 1}, lambda: compute(math.inf), root=tmp_path) == math.inf
    assert calls == [x, 7.0, math.inf]


def test_disk_memo_recomputes_a_damaged_or_foreign_file(tmp_path):
    disk_memo("ns", {"k": "v"}, lambda: 1.5, root=tmp_path)
    (path,) = (tmp_path / "ns").glob("*.json")
    path.write_text("{not json")
    assert disk_memo("ns", {"k": "v"}, lambda: 2.5, root=tmp_path) == 2.5
    stored = json.loads(path.read_text())
    path.write_text(json.dumps({"key": {"k": "other"}, "value": 9.0}))  # a hash collision must not be trusted
    assert disk_memo("ns", {"k": "v"}, lambda: 3.5, root=tmp_path) == 3.5
    assert stored == {"key": {"k": "v"}, "value": 2.5}
