"""Monarch's labelled slices (``Slice``, ``Shape``, ``Region``, ``ShapeExt``) as its tests and
some programs build and cut them: values, texts and errors.  Runs unchanged on monarch and on
torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import pickle

from monarch._rust_bindings.monarch_hyperactor.shape import Extent, Shape, Slice
from monarch._src.actor.shape import MeshTrait, NDSlice, ShapeExt


def attempt(what, f):
    try:
        print(what, "->", f())
    except Exception as e:  # the type and text are what this program checks
        print(what, "->", type(e).__name__, e)


grid = Slice(offset=2, sizes=[3, 4], strides=[8, 2])
print("grid", grid, "ndim", grid.ndim, "len", len(grid))
print("ranks", list(grid))
print("rank 12 at", grid.coordinates(12), "position", grid.index(12), "position 5 is", grid.get(5))
print("item [2, 3]", grid.nditem([2, 3]), "items 3:9:2", grid[3:9:2], "item 11", grid[11])
attempt("rank 3", lambda: grid.index(3))
attempt("position 12", lambda: grid.get(12))
attempt("item 12", lambda: grid[12])
attempt("item with one coordinate", lambda: grid.nditem([1]))
attempt("overlapping strides", lambda: Slice(offset=0, sizes=[2, 2], strides=[1, 1]))
attempt("stride inside the space before", lambda: Slice(offset=0, sizes=[4, 2], strides=[1, 3]))
attempt("strides that do not nest", lambda: Slice(offset=0, sizes=[2, 2], strides=[2, 3]))
attempt("one stride short", lambda: Slice(offset=0, sizes=[2, 2], strides=[1]))
attempt("negative offset", lambda: Slice(offset=-1, sizes=[1], strides=[1]))
print("runs of ranks", Slice.from_list([9, 1, 3, 5, 6, 7, 20]))
print("row major", Slice.new_row_major([2, 3, 4]), "is NDSlice", NDSlice is Slice)
print("row major of no dimensions", Slice.new_row_major([]), list(Slice.new_row_major([])), "one", Slice.new_row_major([5]))
print("equal and hash alike", grid == Slice(offset=2, sizes=[3, 4], strides=[8, 2]),
      hash(grid) == hash(Slice(offset=2, sizes=[3, 4], strides=[8, 2])), grid == list(grid))
print("pickles", pickle.loads(pickle.dumps(grid)) == grid, grid.__getnewargs_ex__())

mesh = Shape(["host", "gpu", "port"], Slice.new_row_major([2, 3, 4]))
print("shape", mesh, repr(mesh), len(mesh))
print("rank 17 at", mesh.coordinates(17), "extent", mesh.extent, mesh.extent == Extent(["host", "gpu", "port"], [2, 3, 4]))
one = mesh.at("gpu", 2)
print("gpu 2", one.labels, one.ndslice, one.ranks())
cut = mesh.select("port", slice(1, None, 2))
print("odd ports", cut.labels, cut.ndslice, cut.ranks())
print("host 1, gpu 0", mesh.index(host=1, gpu=0).ranks())
print("ext", ShapeExt.slice(mesh, host=1, port=slice(0, 2)), ShapeExt.slice(mesh, gpu=slice(1, 3)).ndslice)
attempt("at a missing dimension", lambda: mesh.at("rack", 0))
attempt("at gpu 3", lambda: mesh.at("gpu", 3))
attempt("at gpu -1", lambda: mesh.at("gpu", -1))
attempt("select past the end", lambda: mesh.select("gpu", slice(3, 5)))
attempt("select nothing", lambda: mesh.select("gpu", slice(2, 1)))
attempt("rank 24", lambda: mesh.coordinates(24))
attempt("labels and sizes differ", lambda: Shape(["host"], Slice.new_row_major([2, 3])))
attempt("ext missing dimension", lambda: ShapeExt.slice(mesh, rack=0))
attempt("ext gpu 5", lambda: ShapeExt.slice(mesh, gpu=5))
try:
    hash(mesh)
except TypeError:  # the text names the class by its module, which differs
    print("a shape does not hash")
print("unity", Shape.unity(), len(Shape.unity()), Shape.unity().ranks())
print("equal", mesh == Shape(["host", "gpu", "port"], Slice.new_row_major([2, 3, 4])), mesh == one, mesh == "x")
print("pickles", pickle.loads(pickle.dumps(cut)) == cut)
region = cut.region
print("region", region.labels, region.slice(), region.as_shape() == cut, dict(region.point_of_base_rank(15)))


class Grid(MeshTrait):
    """A mesh that is only its shape (MeshTrait gives it slice, split, flatten, rename, size)."""

    def __init__(self, shape):
        self.shape = shape

    @property
    def _ndslice(self):
        return self.shape.ndslice

    @property
    def _labels(self):
        return tuple(self.shape.labels)

    def _new_with_shape(self, shape):
        return Grid(shape)

    def __repr__(self):
        return f"Grid{self.shape}"


g = Grid(Shape(["host", "gpu"], Slice.new_row_major([4, 6])))
print("mesh", len(g), g.sizes, g.size("gpu"), g.size(("host", "gpu")), g.extent)
print("split", g.split(host=("dp", "pp"), gpu=("tp", "cp"), pp=2, cp=3).shape.ndslice)
print("rename", g.rename(host="dp").shape, "flatten", g.flatten("rank").shape.ndslice)
print("cut", g.slice(gpu=slice(0, 6, 2)).shape.ranks())
attempt("flatten a sparse mesh", lambda: g.slice(gpu=slice(0, 6, 2)).flatten("rank"))
attempt("split two unknowns", lambda: g.split(host=("a", "b")))
attempt("split unevenly", lambda: g.split(gpu=("a", "b"), b=4))
attempt("split to a name in use", lambda: g.split(host=("gpu", "x"), x=2))
attempt("unused size", lambda: g.split(zz=3))
attempt("split into a string", lambda: g.split(host="dp"))
attempt("size of a missing dimension", lambda: g.size("rack"))
print("done")
