"""The draftlens metric-plugin SDK for Python: what plugins/sdk is for Rust, in plain Python.

A plugin is a module with a class ``Evaluator`` (the contract's exported interface); this module
provides ``Plugin``, which implements it from three pieces a metric author writes:

    class MyMetric(draftlens_metric.Plugin):
        metadata = draftlens_metric.metadata(name=..., version=..., metrics=[...], params=[...])
        def accumulator(self, params): return MyAccumulator(params)   # params: a Params
    class MyAccumulator(draftlens_metric.Accumulator):
        def accumulate(self, batch): ...                        # batch: a Batch (views below)
        def finish(self): return [draftlens_metric.ratio("name", num, den), ...]

and in the plugin module: ``Evaluator = MyMetric`` and ``Accumulator = draftlens_metric.Accumulator``.

The contract (plugins/wit/metric.wit) is the same as for Rust plugins; the component is built
with componentize-py and ``--stub-wasi``, so it imports nothing but draftlens:metric/host (built
without it, it imports WASI, which the host serves deny-all: no files, network or environment, a
fixed clock, seeded randomness).
Keep every piece of state in the accumulator (the host runs one per group in one instance).
"""

import math

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import host, types

REGION_COMPLETION = 0
REGION_PROMPT = 1


def log(level, message):
    """Log through the host ("debug", "info", "warn" or "error"); bounded by the host."""
    host.log(
        {
            "debug": host.Level.DEBUG,
            "info": host.Level.INFO,
            "warn": host.Level.WARN,
            "error": host.Level.ERROR,
        }[level],
        str(message),
    )


def metric(name, unit, description, higher_is_better=True):
    return types.MetricSpec(name, unit, description, higher_is_better)


def param(name, description, default):
    """A parameter with its default (int, float, bool or str: the kind is the default's)."""
    return types.ParamSpec(name, description, _value(default))


def region_param(default="completion"):
    return param("region", "anchors counted: completion | prompt | all", default)


def metadata(name, version, description, metrics, params=(), candidates=0, draft_logprobs=True, target_topk=True):
    """What describe() returns. candidates: candidates per position read (0 = all)."""
    return types.Metadata(
        name,
        version,
        description,
        list(metrics),
        list(params),
        types.Inputs(candidates, draft_logprobs, target_topk),
    )


def _value(v):
    if isinstance(v, bool):
        return types.ParamValue_Flag(v)
    if isinstance(v, int):
        return types.ParamValue_Int(v)
    if isinstance(v, float):
        return types.ParamValue_Float(v)
    return types.ParamValue_Text(str(v))


class PluginError(Exception):
    """Raise ``PluginError.invalid_params("...")`` (or invalid_batch / internal) to fail on purpose."""

    def __init__(self, err):
        super().__init__(err)
        self.err = err

    @staticmethod
    def invalid_params(message):
        return PluginError(types.PluginError_InvalidParams(message))

    @staticmethod
    def invalid_batch(message):
        return PluginError(types.PluginError_InvalidBatch(message))

    @staticmethod
    def internal(message):
        return PluginError(types.PluginError_Internal(message))


def _exited(e):
    """``sys.exit()`` (SystemExit) as the plugin error that says so: left to itself it escapes
    the component and the host sees only a broken runtime (issue 39: a 1.4 KB wasm backtrace)."""
    return Err(
        types.PluginError_Internal(
            f"called sys.exit({e.code!r}); a plugin reports a problem by raising PluginError"
        )
    )


class Params:
    """The parameters a plugin was given, with the defaults it declared for the others."""

    def __init__(self, specs, given):
        self._values = {s.name: s.default.value for s in specs}
        for p in given:
            if p.name not in self._values:
                raise PluginError.invalid_params(f"unknown parameter {p.name}")
            self._values[p.name] = p.value.value

    def __getitem__(self, name):
        return self._values[name]

    def region(self, name="region"):
        """The ``region`` parameter as a predicate over a block's region."""
        v = self._values[name]
        if v == "completion":
            return lambda r: r == REGION_COMPLETION
        if v == "prompt":
            return lambda r: r == REGION_PROMPT
        if v == "all":
            return lambda r: True
        raise PluginError.invalid_params(f"parameter {name}: {v!r} is not completion, prompt or all")


class Batch:
    """Views of a columnar batch (the WIT ``batch``): blocks, positions k = 1..P, candidates."""

    def __init__(self, b):
        self.raw = b
        self.block_size = b.block_size
        self.top_k = b.top_k
        self.positions = max(b.block_size - 1, 0)
        self.num_blocks = len(b.anchor)
        # Candidates per position as sent: the host sends only what describe() declared.
        n_pos = self.num_blocks * self.positions
        self.candidates = len(b.draft_ids) // n_pos if n_pos else 0

    def region(self, block):
        return self.raw.region[block]

    def valid(self, block, k):
        return self.raw.valid[block * self.positions + k - 1] != 0

    def target(self, block, k):
        return self.raw.target[block * self.positions + k - 1]

    def draft_top1(self, block, k):
        return self.raw.draft_ids[(block * self.positions + k - 1) * self.candidates]

    def accepted_len(self, block):
        """A: leading positions whose draft top-1 equals the target (valid positions only)."""
        a = 0
        for k in range(1, self.positions + 1):
            if not self.valid(block, k) or self.draft_top1(block, k) != self.target(block, k):
                break
            a += 1
        return a


def ratio(num, den):
    """num / den, NaN (undefined, count 0) when den is 0."""
    return num / den if den else math.nan


class PerPosition:
    """Numerator and denominator per position k = 1..P (index k - 1)."""

    def __init__(self):
        self.num = []
        self.den = []

    def ensure(self, positions):
        while len(self.num) < positions:
            self.num.append(0.0)
            self.den.append(0)

    def pooled(self, name):
        """The pooled ratio with the per-position series (what the Rust SDK's pooled() gives)."""
        num = sum(self.num)
        den = sum(self.den)
        return value(
            name,
            ratio(num, den),
            den,
            series=[ratio(n, d) for n, d in zip(self.num, self.den)],
            counts=list(self.den),
        )


def value(name, value, count, series=None, counts=None, histogram=False):
    """A metric value; NaN means undefined and must come with count 0."""
    s = None
    if series is not None:
        kind = types.SeriesKind.HISTOGRAM if histogram else types.SeriesKind.PER_POSITION
        s = types.Series(kind, [float(x) for x in series], list(counts))
    return types.MetricValue(name, float(value), count, s)


class Accumulator:
    """Base of a plugin's accumulator. The component's exported resource is this class: it
    forwards to the object the plugin's ``begin`` returned."""

    def __init__(self, inner=None):
        self._inner = inner

    def accumulate(self, batch):
        try:
            self._inner.accumulate(Batch(batch))
        except PluginError as e:
            raise Err(e.err)
        except SystemExit as e:
            raise _exited(e)

    def finish(self):
        try:
            return self._inner.finish()
        except PluginError as e:
            raise Err(e.err)
        except SystemExit as e:
            raise _exited(e)


class Plugin:
    """Base of a plugin: set ``metadata`` and implement ``accumulator(params)``, which returns a
    fresh object with ``accumulate(batch)`` and ``finish()``."""

    metadata = None

    def describe(self):
        return self.metadata

    def begin(self, params):
        try:
            return Accumulator(self.accumulator(Params(self.metadata.params, params)))
        except PluginError as e:
            raise Err(e.err)
        except SystemExit as e:
            raise _exited(e)

    def evaluate(self, params, batch):
        acc = self.begin(params)
        acc.accumulate(batch)
        return acc.finish()

    def accumulator(self, params):
        raise NotImplementedError
