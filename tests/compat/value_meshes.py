"""Value meshes as Monarch's runtime gives them (``monarch._rust_bindings.monarch_hyperactor.value_mesh``,
a ``MeshTrait``), one an endpoint returns split, renamed, sliced, flattened and pickled, and the
selection expressions of ``monarch._rust_bindings.monarch_hyperactor.selection``.  (Slices and
shapes themselves: shapes.py.)  Runs unchanged on monarch and on torchmonarch 0.7.0."""

import pickle

from monarch._rust_bindings.monarch_hyperactor.selection import Selection
from monarch._rust_bindings.monarch_hyperactor.shape import Shape, Slice
from monarch._rust_bindings.monarch_hyperactor.value_mesh import ValueMesh as RawValueMesh
from monarch._src.actor.shape import MeshTrait
from monarch.actor import Actor, ValueMesh, current_rank, endpoint, this_host


def attempt(f):
    try:
        return f()
    except Exception as e:  # noqa: BLE001 - the type is what is printed
        return type(e).__name__


s = Slice(offset=10, sizes=[2, 3], strides=[6, 2])
print("negative and junk items", attempt(lambda: s[-1]), attempt(lambda: s["a"]), attempt(lambda: s.get(-1)))
print("selection", Selection.from_string("*, 0:4:2 | (1, ?)"), Selection.all(), Selection.any())
print("selection nests", Selection.from_string("*,*,(:2|6:)"), Selection.from_string("0 & 1::3"))
print("selection refused", attempt(lambda: Selection.from_string("1:2:")), attempt(lambda: Selection.from_string("(*")))

raw = RawValueMesh(Shape(["n"], Slice.new_row_major([3])), ["a", "b", "c"])
print("value mesh", len(raw), raw.values(), raw.get(2), attempt(lambda: raw.get(3)), isinstance(raw, ValueMesh))
print("from_indexed", RawValueMesh.from_indexed(raw._shape, [(2, "z"), (0, "x"), (1, "y"), (2, "w")]).values(),
      attempt(lambda: RawValueMesh.from_indexed(raw._shape, [(0, 1)])))
strided = RawValueMesh(Shape(["a", "b"], Slice(offset=4, sizes=[2, 2], strides=[8, 2])), [1, 2, 3, 4])
print("strided", strided.slice(b=1).values(), strided.item(a=1, b=0), attempt(lambda: strided.flatten("r")), strided.sizes)


class Where(Actor):
    @endpoint
    def rank(self) -> int:
        return current_rank().rank


procs = this_host().spawn_procs(per_host={"gpus": 6})
vm = procs.spawn("where", Where).rank.call().get()
print("answers", isinstance(vm, ValueMesh), isinstance(vm, MeshTrait), ValueMesh[int] is ValueMesh, vm.values())
split = vm.split(gpus=("pairs", "two"), two=2)
print("split", split.sizes, split.slice(two=1).values(), split.item(pairs=2, two=0), split.size("pairs"))
print("renamed", vm.rename(gpus="ranks").sizes, "sliced then flattened", vm.slice(gpus=slice(3, 6)).flatten("r").values())
print("refused", attempt(lambda: vm.split(gpus=("a", "b"), b=4)), attempt(lambda: vm.slice(gpus=6)),
      attempt(lambda: vm.slice(hosts=0)), attempt(lambda: setattr(vm, "extra", 1)))
print("pickled", pickle.loads(pickle.dumps(split)).slice(pairs=1).values())
procs.stop().get()
print("done")
