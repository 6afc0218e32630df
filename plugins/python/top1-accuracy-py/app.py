"""top1-accuracy in Python: the built-in top1-accuracy metric (plugins/top1-accuracy), written
with the Python SDK (plugins/python/sdk), to show and measure Python plugins. Same metric
name, same values (crates/plugin-host/tests/python.rs checks them against the Rust plugin)."""

import draftlens_metric as dm


class Top1:
    def __init__(self, params):
        self.region = params.region()
        self.hits = dm.PerPosition()

    def accumulate(self, batch):
        p = batch.positions
        self.hits.ensure(p)
        num, den = self.hits.num, self.hits.den
        for b in range(batch.num_blocks):
            if not self.region(batch.region(b)):
                continue
            for k in range(1, p + 1):
                if batch.valid(b, k):
                    den[k - 1] += 1
                    if batch.draft_top1(b, k) == batch.target(b, k):
                        num[k - 1] += 1.0

    def finish(self):
        return [self.hits.pooled("top1_acc")]


class Evaluator(dm.Plugin):
    metadata = dm.metadata(
        name="top1-accuracy-py",
        version="0.1.0",
        description="per-position top-1 accuracy (Python port of top1-accuracy)",
        metrics=[
            dm.metric(
                "top1_acc",
                "fraction",
                "P(draft top-1 = target token) over valid positions; value pooled over positions, "
                "series per position k",
            )
        ],
        params=[dm.region_param("completion")],
        candidates=1,
        draft_logprobs=False,
        target_topk=False,
    )

    def accumulator(self, params):
        return Top1(params)


Accumulator = dm.Accumulator
