"""What a metric instrument hands to the instrument underneath it (``inner``, which Monarch's own
tests replace to watch it): each value, with attribute values as strings.  Runs unchanged on
monarch and on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

from monarch._src.actor.telemetry import Counter, UpDownCounter


class Watch:
    def __init__(self):
        self.calls: list = []

    def add(self, amount, attributes=None):
        self.calls.append((amount, attributes))


for cls, amounts in ((Counter, [5, 10]), (UpDownCounter, [7, -3])):
    instrument = cls(f"compat_{cls.__name__.lower()}")
    instrument.inner = watch = Watch()
    instrument.add(amounts[0], attributes={"step": 3, "phase": "warmup"})
    instrument.add(amounts[1], attributes=None)
    print(cls.__name__, watch.calls)
