"""One ``ones`` decision (``OnesContext``) from its named inputs (``DecisionInputs``: caps, the goodput table,
remaining work, GPUs held, churn charges, ...) and weights (``FitnessWeights``): the fitness, a sum of named
(P, J) terms (``FitnessTerms``: completion with the horizon tail, churn, waiting, GPU-time), the repair of
infeasible individuals and the greedy seed individual of the search (``ones.py`` evolves them).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class DecisionInputs(NamedTuple):
    """What one decision knows, by name: (J,) per job unless said (``OnesPolicy.context`` builds them)."""

    gpus: int  # GPUs in the cluster
    caps: np.ndarray  # the most GPUs each job may get
    goodput: np.ndarray  # (J, N + 1) goodput on n = 0..N GPUs, consolidated, at the batch the job picks
    remaining: np.ndarray  # base-equivalent samples left
    held: np.ndarray  # GPUs held now (0: queued)
    # s the job is charged for n = 0..N GPUs, (J, N + 1) (the churn charge; 0 at the count it holds; column 0:
    # its start after it waits), or (J,) one charge for any change of its count
    change_cost: np.ndarray
    submit: np.ndarray  # submission time (s)
    requested: np.ndarray  # GPUs requested: a queued job is assumed to start on them (capped)
    held_goodput: np.ndarray | None = None  # goodput on the GPUs held, their real placement (unchanged counts)
    waited_s: np.ndarray | None = None  # s waited without GPUs (None: completions unweighted)
    locked: np.ndarray | None = None  # jobs that keep the count they hold in every individual (the hold)
    # (J, N + 1) s a running job's grow to n loses to the grow's delay (it trains at its old rate meanwhile),
    # charged as churn and weighed by the repair's padding; None: changes take effect when decided
    grow_lag: np.ndarray | None = None


class FitnessWeights(NamedTuple):
    """How the terms add up (``OnesContext.fitness``)."""

    horizon_s: float = 1800.0  # a job still running here counts the horizon plus its tail
    tail_chain_plain: float = 0.0  # the tail's share valued at the request's goodput (else the chain tail)
    gpu_time_weight: float = 0.0  # per GPU-second beyond the most efficient size, over the cluster's GPUs
    wait_weight: float = 1.0  # k: a job's completion counts 1 + waited / (k x its time left at its request)


class FitnessTerms(NamedTuple):
    """The fitness's terms of each job in each individual, (P, J) each (``OnesContext.terms``). ``completion``
    includes the churn and the wait (the job runs after them); ``gpu_time`` adds with its weight."""

    completion: np.ndarray  # predicted completion (s from now; a job late at the horizon by its tail), weighted
    churn: np.ndarray  # s of its change cost before it runs (a changed count, or a start)
    waiting: np.ndarray  # s a queued job waits for its request to free up (0: scheduled)
    gpu_time: np.ndarray  # GPU-seconds spent beyond its most GPU-efficient size (0: no GPU-time weight)


class OnesContext:
    """One decision's named inputs and weights (``DecisionInputs``, ``FitnessWeights``); the fitness, its
    terms, the repair and the greedy seed of the search."""

    def __init__(self, inputs: DecisionInputs, weights: FitnessWeights | None = None):
        weights = weights if weights is not None else FitnessWeights()
        self.inputs, self.weights = inputs, weights
        G, caps, table, remaining = inputs.gpus, inputs.caps, inputs.goodput, inputs.remaining
        self.gpu_time_weight, self.horizon_s = weights.gpu_time_weight, weights.horizon_s
        self.tail_chain_plain = weights.tail_chain_plain
        self.cur_rate = inputs.held_goodput
        self.G, self.caps, self.table, self.remaining, self.cur = G, caps, table, remaining, inputs.held
        self.lock = inputs.locked
        self.submit = inputs.submit
        J = len(caps)
        charge = np.asarray(inputs.change_cost, dtype=float)
        if charge.ndim == 1:  # one charge for any change of the count: none where a running job keeps it
            charge = np.repeat(charge[:, None], table.shape[1], axis=1)
            kept = (self.cur > 0) & (self.cur < table.shape[1])
            charge[kept, self.cur[kept]] = 0.0
        lag = inputs.grow_lag
        self.change_cost = charge if lag is None else charge + lag  # (J, N + 1)
        self.idx = np.arange(J)
        # Time alone at 1 GPU: serves as "shortest remaining first" order for queued jobs.
        self.t1 = remaining / np.maximum(table[:, 1], 1e-12)
        self.srt_order = np.lexsort((self.submit, self.t1))
        # Best count per job: the one minimising solo run time... weighted by GPUs (cheap, efficient).
        n = np.arange(table.shape[1])
        with np.errstate(divide="ignore"):
            run = np.where(n[None, :] > 0, remaining[:, None] / np.maximum(table, 1e-12), np.inf)
        run[n[None, :] > caps[:, None]] = np.inf
        self.run_time = run  # (J, N+1)
        self.pad_time = run if lag is None else run + lag  # what the repair's padding weighs
        # A queued job is assumed to start on its requested GPUs (capped) once that many are free.
        self.need = np.clip(inputs.requested, 1, caps)
        self.t_need = run[self.idx, self.need]
        self.ref_rate = np.maximum(table[self.idx, self.need], 1e-12)
        counts = np.arange(1, table.shape[1])
        self.best_rate_per_gpu = np.maximum((table[:, 1:] / counts[None, :]).max(axis=1), 1e-12)
        # The most goodput each job can reach (at any count up to its cap): ``_chain_tail``'s fastest time.
        self.max_rate = np.maximum(np.where(n[None, :] <= caps[:, None], table, 0.0).max(axis=1), 1e-12)
        # (J,) factors on each job's completion term; None: all 1.
        self.wait_weights = (None if inputs.waited_s is None else
                             1.0 + inputs.waited_s / (weights.wait_weight * np.maximum(self.t_need, 1.0)))

    def solo_time(self, counts: np.ndarray) -> np.ndarray:
        return self.run_time[self.idx, counts]

    def _one_each(self) -> np.ndarray:
        """(J,) 1 GPU per job, shortest-remaining first, while GPUs last."""
        counts = np.zeros(len(self.caps), dtype=np.int64)
        counts[self.srt_order[:self.G]] = 1
        return counts

    def greedy(self) -> np.ndarray:
        """A seed individual: queued and running jobs get 1 GPU shortest-first, then jobs double where their
        solo run time drops the most per added GPU."""
        counts = self._one_each()
        free = self.G - int(counts.sum())
        while free > 0:
            nxt = np.minimum(np.maximum(counts * 2, 1), self.caps)
            add = nxt - counts
            ok = (counts > 0) & (add > 0) & (add <= free)
            if not ok.any():
                break
            gain = (self.solo_time(counts) - self.solo_time(nxt)) / np.maximum(add, 1)
            gain[~ok] = -np.inf
            j = int(np.argmax(gain))
            if gain[j] <= 0:
                break
            free -= int(add[j])
            counts[j] = nxt[j]
        return counts

    def repair(self, pop: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Make every individual feasible (sum <= G, 0 <= n <= cap), then pad the free GPUs.

        Vectorised over the population. Over-full individuals keep jobs shortest-remaining first
        while they fit (the one that overflows shrinks); padding gives queued jobs GPUs
        shortest-remaining first (1 each, or their request), then lets scheduled jobs double while
        that shortens them (a grow's delay included) and GPUs remain.
        """
        order = self.srt_order
        caps_o = self.caps[order][None, :]
        floor_o = np.zeros_like(caps_o)
        if self.lock is not None:  # locked jobs keep the count they hold (together at most G: they hold it)
            floor_o = np.where(self.lock[order], self.cur[order], 0)[None, :]
            caps_o = np.where(floor_o > 0, floor_o, caps_o)
        x = np.clip(pop[:, order], floor_o, caps_o)  # (P, J) in shortest-first order
        extra = x - floor_o  # the GPUs above the locked counts are kept shortest first while they fit
        cum = np.cumsum(extra, axis=1)
        x = floor_o + np.clip(self.G - int(floor_o.sum()) - (cum - extra), 0, extra)
        free = self.G - x.sum(axis=1)  # (P,)
        waiting = x == 0
        # Half the individuals give queued jobs 1 GPU each (sharing); the other half their requested
        # count, shortest first, while it fits (run-to-completion). Both shapes stay reachable.
        share = rng.random(x.shape[0]) < 0.5
        want = np.where(share[:, None], 1, self.need[order][None, :]) * waiting
        give = waiting & (np.cumsum(want, axis=1) <= free[:, None])
        x = x + np.where(give, want, 0)
        free = free - np.where(give, want, 0).sum(axis=1)
        run_o = self.pad_time[order]  # (J, N+1)
        jo = np.arange(len(order))[None, :]
        for _ in range(2):
            if not (free > 0).any():
                break
            nxt = np.minimum(caps_o, 2 * x)
            better = (x > 0) & (nxt > x) & (run_o[jo, nxt] < run_o[jo, x])
            add = np.where(better, nxt - x, 0)
            accept = better & (np.cumsum(add, axis=1) <= free[:, None])
            x = x + np.where(accept, add, 0)
            free = free - np.where(accept, add, 0).sum(axis=1)
        out = np.empty_like(x)
        out[:, order] = x
        return out

    def fitness(self, pop: np.ndarray) -> np.ndarray:
        """(P,) predicted sum of completion times (s from now) of all jobs; lower is better.

        A job that finishes within the horizon ``H`` counts its predicted finish time. A job still
        running at ``H`` counts ``H`` plus an estimate of how long its leftover work takes after it
        (``_chain_tail`` blended with the leftover at its requested GPUs' goodput): this round's choice only
        decides how much progress it makes before ``H``, because its allocation will be revisited long
        before it finishes. Without the horizon, shrinking a long job would be charged as if it stayed small
        until the end, and long jobs would hog the cluster.
        """
        terms = self.terms(pop)
        total = terms.completion.sum(axis=1)
        if self.gpu_time_weight > 0:
            total = total + self.gpu_time_weight * terms.gpu_time.sum(axis=1) / self.G
        return total

    def terms(self, pop: np.ndarray) -> FitnessTerms:
        """Each job's terms of the fitness in each individual of ``pop`` (P, J): its predicted completion
        (within the horizon, else the horizon plus its tail; times its wait weight), which comes after its
        churn (the charge of a changed count, or of a start) and, queued, its wait for its request; and the
        GPU-seconds it spends beyond its most GPU-efficient size (0 when ``gpu_time_weight`` is 0)."""
        P, J = pop.shape
        H = self.horizon_s
        on = pop > 0
        charge = self.change_cost[self.idx[None, :], pop]  # (P, J) of its count (column 0: of its later start)
        cost = np.where(on, charge, 0.0)
        run = self.run_time[self.idx[None, :], pop]  # (P, J); inf where n = 0
        rate = self.table[self.idx[None, :], np.where(on, pop, self.need[None, :])]  # goodput while running
        if self.cur_rate is not None:
            kept = on & (pop == self.cur[None, :]) & (self.cur_rate[None, :] > 0)
            rate = np.where(kept, self.cur_rate[None, :], rate)
            run = np.where(kept, self.remaining[None, :] / np.maximum(rate, 1e-12), run)
        finish = np.where(on, cost + run, np.inf)
        waiting = np.where(on, 0.0, self._queue_start(pop, finish))
        churn = charge
        start = np.where(on, cost, waiting + charge)
        n_eff = np.where(on, pop, self.need[None, :])
        done_by = start + self.remaining[None, :] / np.maximum(rate, 1e-12)
        left = self.remaining[None, :] - rate * np.clip(H - start, 0.0, None)
        left = np.maximum(left, 0.0)
        a = self.tail_chain_plain
        late = H + ((1.0 - a) * self._chain_tail(left, done_by > H) + a * (left / self.ref_rate[None, :]))
        completion = np.where(done_by <= H, done_by, late)
        if self.wait_weights is not None:
            completion = completion * self.wait_weights[None, :]
        if self.gpu_time_weight <= 0:
            return FitnessTerms(completion, churn, waiting, np.zeros_like(completion))
        # Opportunity cost of inefficient scaling within the horizon: GPU-seconds spent beyond what the
        # same progress costs at the job's most GPU-efficient size delay queued and future jobs.
        busy = np.clip(np.minimum(done_by, H) - start, 0.0, None)
        progress = rate * busy
        used = n_eff * (busy + np.where(on, start, 0.0))  # a scheduled job holds GPUs while restarting
        ref = progress / self.best_rate_per_gpu[None, :]
        return FitnessTerms(completion, churn, waiting, np.maximum(used - ref, 0.0))

    def _chain_tail(self, left: np.ndarray, is_late: np.ndarray) -> np.ndarray:
        """(P, J) ``tail_chain``: how long after the horizon each job still running there (``is_late``) takes to
        finish its leftover work ``left``, estimated as the later of two relaxations (those of the lower bound,
        ``sim/bound.py``, applied to the late jobs at the horizon): the job alone at its fastest goodput
        (``max_rate``), and its place in a shortest-first queue of the late jobs' leftover GPU-time at their most
        GPU-efficient size, the whole cluster serving ``G`` GPU-seconds per second. The plain term (the
        leftover at the requested count) makes every split of the cluster between jobs that scale linearly look
        the same; here a late job's progress also moves up every late job behind it, so the jobs with the least
        leftover GPU-time are pressed to finish first, and a job that can use the whole cluster on its own is
        not valued as if it kept its request. Entries of jobs done by the horizon are not used."""
        fast = left / self.max_rate[None, :]
        work = np.where(is_late, left / self.best_rate_per_gpu[None, :], np.inf)  # least GPU-seconds
        return np.maximum(fast, self._served_least_first(work))

    def _served_least_first(self, work: np.ndarray) -> np.ndarray:
        """(P, J) when each job's GPU-seconds ``work`` (inf: not in the queue) are done, the cluster serving
        ``G`` GPU-seconds per second to the queued jobs least work first (the fluid form of SRPT)."""
        order = np.argsort(work, axis=1, kind="stable")
        ws = np.take_along_axis(work, order, axis=1)
        done = np.cumsum(np.where(np.isfinite(ws), ws, 0.0), axis=1) / max(self.G, 1)
        out = np.empty_like(done)
        np.put_along_axis(out, order, done, axis=1)
        return out

    def _queue_start(self, pop: np.ndarray, finish: np.ndarray) -> np.ndarray:
        """(P, J) predicted start time of each queued job (undefined where the job is scheduled).

        Queued jobs (shortest first) each wait until enough GPUs have been freed by finishing jobs for
        its requested count. Past the point where every scheduled job has finished, queued jobs share
        the cluster in series (their GPU-time divided by the cluster).
        """
        P, J = pop.shape
        order = self.srt_order
        waiting = (pop == 0)[:, order]  # (P, J) shortest first
        out = np.zeros((P, J))
        if not waiting.any():
            return out
        fo = np.argsort(finish, axis=1)  # scheduled jobs by finish time; queued (inf) last
        f_sorted = np.take_along_axis(finish, fo, axis=1)
        g_sorted = np.take_along_axis(pop, fo, axis=1)
        free0 = self.G - pop.sum(axis=1)
        freed = np.concatenate([free0[:, None], free0[:, None] + np.cumsum(g_sorted, axis=1)], axis=1)  # (P, J+1)
        times = np.concatenate([np.zeros((P, 1)), f_sorted], axis=1)  # (P, J+1)
        need = self.need[order][None, :]
        demand = np.cumsum(np.where(waiting, need, 0), axis=1)  # GPUs the first k queued jobs hold
        # Row-wise searchsorted by offsetting rows into one sorted array.
        span = float(2 * self.G + int(self.need.sum()) + 2)
        offs = np.arange(P)[:, None] * span
        k = np.searchsorted((freed + offs).ravel(), (demand + offs).ravel(), side="left").reshape(P, J)
        k -= np.arange(P)[:, None] * (J + 1)
        over = k > J
        start = np.take_along_axis(times, np.minimum(k, J), axis=1)
        if over.any():
            t_run = self.t_need[order][None, :]
            last = np.max(np.where(np.isfinite(times), times, 0.0), axis=1)[:, None]
            chain = np.cumsum(np.where(waiting & over, need * t_run, 0.0), axis=1) / max(self.G, 1)
            start = np.where(over, last + chain, start)
        start = np.where(np.isfinite(start), start, 0.0)
        out[:, order] = start
        return out
