# The temporal CSV and SocioPatterns loaders (errors name file:line), the shipped data sets, snapshot cutting
# and the evolving SBM generator.
import numpy as np
import pytest

import os

from cadence.lstm_node2vec import (DataError, cut_snapshots, default_data_path, evolving_sbm, load_dataset,
                                   load_sociopatterns, load_temporal_csv)


def write(tmp_path, text, name="edges.csv"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_loader_remaps_ids_sorts_by_time_and_keeps_self_loops_as_presence(tmp_path):
    path = write(tmp_path, ",u,i,ts,label,idx\n0,10,20,5,0,0\n1,20,30,1,0,1\n2,30,30,9,0,2\n")
    ev = load_temporal_csv(path)
    assert ev.n == 3 and list(ev.node_ids) == [10, 20, 30]
    assert list(ev.ts) == [1, 5, 9]
    assert list(ev.src) == [1, 0, 2] and list(ev.dst) == [2, 1, 2]
    snaps = cut_snapshots(ev, 1)
    g = snaps.graphs[0]
    assert g.num_edges == 2  # the self-loop is no edge
    assert snaps.present[0].all()  # but node 30 was active


@pytest.mark.parametrize("body, line, what", [
    (",u,i,ts\n0,1,2,3\n1,1,x,4\n", 3, "column 'i' is not an integer"),
    (",u,i,ts\n0,1,2,3\n1,1,2\n", 3, "expected 4 fields, got 3"),
    (",u,i,ts\n0,1,2,3\n1,1,2,3\n2,-1,2,3\n", 4, "negative node id"),
    (",u,i,time\n0,1,2,3\n", 1, "no column 'ts'"),
    ("", 1, "empty file"),
])
def test_a_malformed_csv_raises_an_error_naming_file_and_line(tmp_path, body, line, what):
    path = write(tmp_path, body)
    with pytest.raises(DataError) as e:
        load_temporal_csv(path)
    assert str(e.value).startswith(f"{path}:{line}:")
    assert what in str(e.value)


def test_the_cli_reports_a_malformed_csv_with_file_and_line(tmp_path, capsys):
    from cadence.lstm_node2vec.__main__ import main
    path = write(tmp_path, ",u,i,ts\n0,1,2,3\n1,1,2,oops\n")
    assert main(["--data", path, "--quiet"]) == 2
    assert f"{path}:3:" in capsys.readouterr().err


def test_count_split_gives_equal_event_counts_and_duration_split_equal_intervals(tmp_path):
    ts = [0, 1, 2, 3, 4, 5, 6, 7, 100, 101]
    rows = "".join(f"{k},{k % 5},{(k + 1) % 5},{t}\n" for k, t in enumerate(ts))
    ev = load_temporal_csv(write(tmp_path, ",u,i,ts\n" + rows))
    by_count = cut_snapshots(ev, 2, split="count")
    assert by_count.bounds == [(0, 4), (5, 101)]
    by_time = cut_snapshots(ev, 2, split="duration")
    assert by_time.bounds == [(0, 7), (100, 101)]
    cum = cut_snapshots(ev, 2, split="count", cumulative=True)
    assert cum.bounds == [(0, 4), (0, 101)]
    with pytest.raises(ValueError):
        cut_snapshots(ev, 2, split="weekly")


def test_the_sociopatterns_loader_reads_classes_as_labels(tmp_path):
    path = write(tmp_path, "100\t7\t3\tB\tA\n80\t3\t9\tA\tB\n100 9 7 B B\n", name="contacts.dat")
    ev = load_sociopatterns(path)
    assert ev.n == 3 and list(ev.node_ids) == [3, 7, 9] and list(ev.ts) == [80, 100, 100]
    assert ev.label_names == ["A", "B"] and list(ev.labels) == [0, 1, 1]
    snaps = cut_snapshots(ev, 2)
    assert len(snaps.labels) == 2 and list(snaps.labels[1]) == [0, 1, 1]


@pytest.mark.parametrize("body, line, what", [
    ("1\t2\t3\tA\tB\n1\t2\tA\tB\n", 2, "expected 5 fields"),
    ("1\t2\tx\tA\tB\n", 1, "field 'j' is not an integer"),
    ("1\t2\t3\tA\tB\n2\t3\t4\tC\tB\n", 2, "node 3 has class 'C' here but 'B' before"),
    ("\n", 1, "no contact lines"),
])
def test_a_malformed_contact_list_raises_an_error_naming_file_and_line(tmp_path, body, line, what):
    path = write(tmp_path, body, name="contacts.dat")
    with pytest.raises(DataError) as e:
        load_sociopatterns(path)
    assert str(e.value).startswith(f"{path}:{line}:") and what in str(e.value)


@pytest.mark.skipif(not os.path.exists(default_data_path("highschool-2012")),
                    reason="data/highschool-2012 is absent (it may be left out where its CC BY-NC-SA licence does not fit)")
def test_the_shipped_highschool_data_loads_with_its_five_classes():
    ev = load_dataset("highschool-2012")
    assert ev.n == 180 and ev.src.size == 45047
    assert ev.label_names == ["MP*1", "MP*2", "PC", "PC*", "PSI*"]
    assert np.bincount(ev.labels).tolist() == [31, 35, 38, 35, 41]


def test_the_shipped_fb_messages_data_loads():
    ev = load_dataset("fb-messages")
    assert ev.n == 1899 and ev.src.size == 61734 and ev.labels is None
    assert np.all(np.diff(ev.ts) >= 0)


def test_the_sbm_generator_is_seeded_and_plants_its_communities():
    a = evolving_sbm(n=300, communities=3, snapshots=3, avg_degree=6, p_intra=0.9, seed=5)
    b = evolving_sbm(n=300, communities=3, snapshots=3, avg_degree=6, p_intra=0.9, seed=5)
    c = evolving_sbm(n=300, communities=3, snapshots=3, avg_degree=6, p_intra=0.9, seed=6)
    for ga, gb in zip(a.graphs, b.graphs):
        assert np.array_equal(ga.indices, gb.indices) and np.array_equal(ga.indptr, gb.indptr)
    assert not np.array_equal(a.graphs[0].indices, c.graphs[0].indices)
    for t, g in enumerate(a.graphs):
        e = g.edge_list()
        assert 0.8 * 900 < len(e) <= 900  # n * avg_degree / 2, less merged duplicates
        lab = a.labels[t]
        assert np.mean(lab[e[:, 0]] == lab[e[:, 1]]) > 0.85  # 0.9 intra + 0.1 * 1/3 by chance
