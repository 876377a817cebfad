"""ONES as the SC'21 prototype runs it (Bian et al.; policy ``ones-paper``). ``ones.py`` has the improved
default (``ones``).

An individual is one slot per GPU holding a job index or nothing; a population of 16 survives between
rounds; each round breeds 32 children by uniform crossover (p = 0.5) and job-removal mutation (p = 0.3;
jobs younger than 2 epochs are immune), repairs them ("pad": queued jobs get 1 GPU first-come-first-served,
then running jobs grow towards their cap shortest-remaining-time first) and keeps the best 16 of 48 by
fitness ``sum_j n_j * remaining_j / throughput_j(n_j)`` (remaining GPU-time, lower is better), with
throughput extrapolated linearly from what was measured. Per-job size caps start at the request and
double each time a job has spent a whole epoch at its cap, up to 4x the request; when jobs wait and the
cluster is full, the largest long-running job is halved; a job is reconfigured at most once per epoch.
The chosen individual is placed on GPUs displacing as few running jobs as possible.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ones_pipeline.core import estimates
from ones_pipeline.core.goodput import GoodputModel
from ones_pipeline.core.placement import schedule_from_counts
from ones_pipeline.core.policies.base import PolicyBase, PolicyParams, check_float, check_int, check_probability
from ones_pipeline.core.types import Cluster, JobView, Schedule


@dataclass(frozen=True)
class OnesPaperParams(PolicyParams):
    """Parameters of ``ones-paper`` (the prototype's values), checked on construction.

    ``population`` individuals kept; ``children`` bred per round; ``crossover_p`` uniform crossover;
    ``removal_p`` per-job removal in a child; ``immune_epochs``: younger jobs are never removed;
    ``max_scale``: a job's size cap grows to at most this multiple of its request; ``long_running_epochs``:
    a job that has trained this long may be halved to make room for waiting jobs.
    """

    policy = "ones-paper"

    population: int = 16
    children: int = 32
    crossover_p: float = 0.5
    removal_p: float = 0.3
    immune_epochs: float = 2.0
    max_scale: int = 4
    long_running_epochs: float = 2.0

    def __post_init__(self) -> None:
        n = self.policy
        checked = dict(
            population=check_int(n, "population", self.population, 2),
            children=check_int(n, "children", self.children, 1),
            crossover_p=check_probability(n, "crossover_p", self.crossover_p),
            removal_p=check_probability(n, "removal_p", self.removal_p),
            immune_epochs=check_float(n, "immune_epochs", self.immune_epochs, 0.0),
            max_scale=check_int(n, "max_scale", self.max_scale, 1),
            long_running_epochs=check_float(n, "long_running_epochs", self.long_running_epochs, 0.0),
        )
        for name, value in checked.items():
            object.__setattr__(self, name, value)


class OnesPaperPolicy(PolicyBase):
    """The SC'21 prototype's search: slot encoding, population 16, truncation 16 of 48.

    ``OnesPaperPolicy(seed=0, **params)`` takes the keywords of ``OnesPaperParams``; ``config`` holds them.
    """

    name = "ones-paper"

    def __init__(self, seed: int = 0, model: GoodputModel | None = None, **params: Any) -> None:
        super().__init__(seed)
        self.config = OnesPaperParams.from_dict(params)
        self.model = model if model is not None else GoodputModel()  # values the jobs; fits kept between decisions
        self.population: list[list[str | None]] = []  # individuals as job names per slot
        self.caps: dict[str, int] = {}  # current per-job size cap
        self.cap_epoch: dict[str, float] = {}  # epochs done when the job reached its cap

    def params(self) -> dict[str, Any]:
        return self.config.to_dict()

    def _extra_state(self) -> dict[str, Any]:
        return {"population": self.population, "caps": self.caps, "cap_epoch": self.cap_epoch}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.population = [list(ind) for ind in state.get("population", [])]
        self.caps = {k: int(v) for k, v in state.get("caps", {}).items()}
        self.cap_epoch = {k: float(v) for k, v in state.get("cap_epoch", {}).items()}

    def decide(self, now_s: float, cluster: Cluster, jobs: Sequence[JobView], current: Schedule) -> Schedule:
        if not jobs:
            self.population, self.caps, self.cap_epoch = [], {}, {}
            return Schedule()
        c = self.config
        G, J = cluster.num_gpus, len(jobs)
        index = {j.name: i for i, j in enumerate(jobs)}
        cur_counts = np.array([len(current.gpus_of(j.name)) for j in jobs], dtype=np.int64)
        caps = self._update_caps(cluster, jobs, cur_counts)
        thr = self._throughput_table(jobs, int(caps.max()))  # (J, N+1) samples/s by linear extrapolation
        remaining = estimates.remaining_work(jobs)
        epochs = np.array([j.epochs_done for j in jobs])
        # At most one reconfiguration per epoch: such running jobs are frozen at their current slots.
        frozen = np.array([
            cur_counts[i] > 0 and j.last_change_s is not None and j.epochs_done - j.epochs_at_last_change < 1.0
            for i, j in enumerate(jobs)
        ])
        cur_slots = current.slot_array(cluster, index)  # (G,)
        # Remaining-time order for padding (shortest first), FCFS for new jobs.
        t_rem = remaining / np.maximum(thr[:, 1], 1e-12)
        srt = np.lexsort((np.array([j.submit_time_s for j in jobs]), t_rem))
        fcfs = np.argsort([j.submit_time_s for j in jobs], kind="stable")
        ctx = dict(G=G, caps=caps, frozen=frozen, cur_slots=cur_slots, srt=srt, fcfs=fcfs, thr=thr)
        pop = self._evolve(self._initial_population(index, cur_slots, ctx), ctx, remaining, epochs < c.immune_epochs)
        best = pop[0]
        counts = np.bincount(best[best >= 0], minlength=J)
        counts = self._scale_down_largest(counts, jobs, cur_counts, epochs, frozen)
        self.population = [[jobs[x].name if x >= 0 else None for x in ind] for ind in pop]
        order = np.lexsort((np.array([j.submit_time_s for j in jobs]), -counts))
        return schedule_from_counts(cluster, jobs, counts, current, order)

    def _initial_population(self, index: Mapping[str, int], cur_slots: np.ndarray, ctx: dict) -> np.ndarray:
        """(P, G) last round's individuals (for the same cluster size; jobs gone become free slots), else
        the current slots, padded with copies to the population size and repaired."""
        G, P = ctx["G"], self.config.population
        pop = [np.array([index.get(x, -1) if x is not None else -1 for x in ind], dtype=np.int64)
               for ind in self.population if len(ind) == G]
        if not pop:
            pop = [cur_slots.copy()]
        while len(pop) < P:
            pop.append(pop[len(pop) % max(1, len(pop))].copy())
        pop = np.stack(pop[:P])  # (P, G)
        return np.stack([self._repair(ind, ctx) for ind in pop])

    def _evolve(self, pop: np.ndarray, ctx: dict, remaining: np.ndarray, immune: np.ndarray) -> np.ndarray:
        """One round: breed ``children`` children (uniform crossover, job removal, repair) and keep the best
        ``population`` of parents and children, best first."""
        c, G, rng = self.config, ctx["G"], self._rng
        children = []
        for _ in range(c.children):
            a, b = pop[rng.integers(0, len(pop), size=2)]
            child = np.where(rng.random(G) < c.crossover_p, a, b)
            present = np.unique(child[child >= 0])
            drop = present[(rng.random(present.size) < c.removal_p) & ~immune[present]]
            child[np.isin(child, drop)] = -1
            children.append(self._repair(child, ctx))
        allpop = np.concatenate([pop, np.stack(children)])
        fit = np.array([self._fitness(ind, ctx["thr"], remaining) for ind in allpop])
        keep = np.argsort(fit, kind="stable")[:c.population]
        return allpop[keep]

    def _update_caps(self, cluster: Cluster, jobs: Sequence[JobView], cur: np.ndarray) -> np.ndarray:
        """Per-job caps: start at the request; double after a whole epoch at the cap; at most 4x."""
        G = cluster.num_gpus
        live = {j.name for j in jobs}
        self.caps = {k: v for k, v in self.caps.items() if k in live}
        self.cap_epoch = {k: v for k, v in self.cap_epoch.items() if k in live}
        out = np.empty(len(jobs), dtype=np.int64)
        for i, j in enumerate(jobs):
            hard = min(j.spec.gpu_cap, self.config.max_scale * j.spec.requested_gpus, G)
            cap = min(self.caps.get(j.name, j.spec.requested_gpus), hard)
            if cur[i] >= cap:
                since = self.cap_epoch.setdefault(j.name, j.epochs_done)
                if j.epochs_done - since >= 1.0 and cap < hard:
                    cap = min(2 * cap, hard)
                    self.cap_epoch[j.name] = j.epochs_done
            else:
                self.cap_epoch.pop(j.name, None)
            self.caps[j.name] = max(cap, 1)
            out[i] = max(cap, 1)
        return out

    def _throughput_table(self, jobs: Sequence[JobView], max_n: int) -> np.ndarray:
        """(J, max_n + 1) samples/s: measured where seen, else linear in GPUs from the nearest seen count."""
        params = self.model.prior(jobs)
        out = np.zeros((len(jobs), max_n + 1))
        n = np.arange(1, max_n + 1)
        for i, j in enumerate(jobs):
            seen: dict[int, float] = {}
            for o in j.throughput_obs:
                seen[o.num_gpus] = o.num_gpus * o.per_gpu_batch / o.step_time_s
            if not seen:
                per_gpu = float(estimates.goodput_of(params.select(i), 0.0, j.spec.per_gpu_batch,
                                                     j.spec.max_per_gpu_batch or j.spec.per_gpu_batch, 1, 1,
                                                     j.spec.per_gpu_batch, use_efficiency=False))
                seen = {1: per_gpu}
            ks = np.array(sorted(seen))
            nearest = ks[np.argmin(np.abs(ks[None, :] - n[:, None]), axis=1)]
            out[i, 1:] = np.array([seen[k] for k in nearest]) * n / nearest
        return out

    @staticmethod
    def _fitness(ind: np.ndarray, thr: np.ndarray, remaining: np.ndarray) -> float:
        counts = np.bincount(ind[ind >= 0], minlength=thr.shape[0])
        on = np.flatnonzero(counts)
        return float(np.sum(counts[on] * remaining[on] / np.maximum(thr[on, counts[on]], 1e-12)))

    def _repair(self, ind: np.ndarray, ctx: dict) -> np.ndarray:
        """Feasible individual: frozen jobs on their slots, caps respected, then pad free slots."""
        ind = ind.copy()
        caps, frozen, cur_slots = ctx["caps"], ctx["frozen"], ctx["cur_slots"]
        J = len(caps)
        # Frozen jobs keep exactly their current slots.
        frozen_slots = (cur_slots >= 0) & frozen[np.maximum(cur_slots, 0)]
        ind[np.isin(ind, np.flatnonzero(frozen)) & ~frozen_slots] = -1
        ind[frozen_slots] = cur_slots[frozen_slots]
        # Caps: drop slots beyond the cap (keep the first ones).
        for j in np.unique(ind[ind >= 0]):
            slots = np.flatnonzero(ind == j)
            if slots.size > caps[j]:
                ind[slots[caps[j]:]] = -1
        counts = np.bincount(ind[ind >= 0], minlength=J)
        free = np.flatnonzero(ind < 0)
        # Pad 1: jobs holding nothing get one GPU, first come first served.
        k = 0
        for j in ctx["fcfs"]:
            if k >= free.size:
                break
            if counts[j] == 0:
                ind[free[k]] = j
                counts[j] = 1
                k += 1
        # Pad 2: jobs grow towards their cap, shortest remaining time first.
        for j in ctx["srt"]:
            if k >= free.size:
                break
            if frozen[j] or counts[j] == 0:
                continue
            add = min(caps[j] - counts[j], free.size - k)
            if add > 0:
                ind[free[k:k + add]] = j
                counts[j] += add
                k += add
        return ind

    def _scale_down_largest(self, counts: np.ndarray, jobs: Sequence[JobView], cur: np.ndarray,
                            epochs: np.ndarray, frozen: np.ndarray) -> np.ndarray:
        """If jobs still wait, halve the largest long-running job to make room (one per round)."""
        waiting = counts == 0
        if not waiting.any():
            return counts
        long_running = (cur > 1) & (counts > 1) & (epochs >= self.config.long_running_epochs) & ~frozen
        if not long_running.any():
            return counts
        j = int(np.argmax(np.where(long_running, counts, -1)))
        freed = counts[j] - counts[j] // 2
        counts = counts.copy()
        counts[j] //= 2
        for w in np.flatnonzero(waiting)[np.argsort([jobs[w].submit_time_s for w in np.flatnonzero(waiting)],
                                                    kind="stable")][:freed]:
            counts[w] = 1
        return counts
