"""Mesh shapes and views in the telemetry tables, serialized as Monarch's (ndslice's Extent and Region)."""

import json

from monarch_telemetry.recorder import region_json, shape_json


def test_a_mesh_extent_is_inner_labels_and_sizes():
    assert json.loads(shape_json(("hosts", "gpus"), (2, 4))) == {"inner": {"labels": ["hosts", "gpus"], "sizes": [2, 4]}}


def test_a_whole_mesh_is_a_row_major_region():
    assert json.loads(region_json(("hosts", "gpus"), (2, 4))) == {
        "labels": ["hosts", "gpus"], "slice": {"offset": 0, "sizes": [2, 4], "strides": [4, 1]}}


def test_a_slice_keeps_its_offset_and_strides():
    # gpus 1 and 3 of host 1 of a 2 x 4 mesh: members 5 and 7.
    assert json.loads(region_json(("gpus",), (2,), [5, 7])) == {
        "labels": ["gpus"], "slice": {"offset": 5, "sizes": [2], "strides": [2]}}
    # One chosen member: a scalar region.
    assert json.loads(region_json((), (), [6])) == {"labels": [], "slice": {"offset": 6, "sizes": [], "strides": []}}


def test_ranks_that_are_no_grid_are_listed_too():
    d = json.loads(region_json(("w",), (3,), [0, 1, 5]))
    assert d["ranks"] == [0, 1, 5] and d["slice"]["sizes"] == [3]


def test_a_mesh_spawned_on_a_slice_records_where_the_slice_starts():
    from monarch_telemetry.recorder import Recorder

    rec = Recorder("h", enabled=True)
    # Actors spawned on workers 1..2 of a 3-worker proc mesh.
    rec.mesh(1, "Python<W>", "w", "w-1", ("workers",), (2,), 9, ("workers",), (2,), [1, 2])
    rec.mesh(2, "Python<W>", "v", "v-1", ("workers",), (3,), 9, ("workers",), (3,))
    _, columns = rec.take()["meshes_ext"]
    shapes, parents = columns[5], columns[7]
    assert [json.loads(s) for s in shapes] == [{"inner": {"labels": ["workers"], "sizes": [2]}},
                                               {"inner": {"labels": ["workers"], "sizes": [3]}}]
    assert [json.loads(p)["slice"] for p in parents] == [{"offset": 1, "sizes": [2], "strides": [1]},
                                                         {"offset": 0, "sizes": [3], "strides": [1]}]
