"""The arrays and operators of one ``ones`` decision (``OnesContext``): caps, the goodput table, remaining
work; the fitness (predicted sum of completion times), the repair of infeasible individuals and the
seed individuals of the search (``ones.py`` evolves them).

Scheduled jobs' terms of the fitness are separable: a job's predicted completion (and its GPU-time
opportunity cost) depends only on its own count. ``marginal_greedy`` uses that to build a seed the
x2 / /2 mutations cannot reach from a poor start: GPUs handed out one step at a time to the job whose
term falls the most per added GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class OnesContext:
    """Arrays of one decision: caps, goodput table, remaining work; repair and fitness operators."""

    def __init__(self, G: int, caps: np.ndarray, table: np.ndarray, remaining: np.ndarray, cur: np.ndarray,
                 change_cost: np.ndarray, submit: np.ndarray, requested: np.ndarray,
                 gpu_time_weight: float = 0.0, horizon_s: float = 1800.0, cur_rate: np.ndarray | None = None,
                 shrink_cost_factor: float = 1.0, tail_srpt: bool = False, hesrpt: float | str | None = None,
                 hesrpt_scope: str = "all", hesrpt_floor: float = 0.0, tail_chain: bool = False,
                 tail_chain_plain: float = 0.0, start_on_freed: bool = False):
        self.gpu_time_weight, self.horizon_s = gpu_time_weight, horizon_s
        self.start_on_freed = start_on_freed
        self._held_quality: np.ndarray | None = None  # ``freed_quality``'s real/table goodput of each held job
        self.tail_srpt, self.tail_chain, self.tail_chain_plain = tail_srpt, tail_chain, tail_chain_plain
        self.hesrpt, self.hesrpt_scope, self.hesrpt_floor = hesrpt, hesrpt_scope, hesrpt_floor
        self._weights: np.ndarray | None = None
        # (J,) factors on each job's completion term (``OnesParams.wait_weight``); None: all 1.
        self.wait_weights: np.ndarray | None = None
        self.shrink_cost_factor = shrink_cost_factor
        # Goodput of each job on the GPUs it holds (its real placement), used where its count is unchanged.
        self.cur_rate = cur_rate
        self.G, self.caps, self.table, self.remaining, self.cur = G, caps, table, remaining, cur
        # (J,) jobs that keep the count they hold in every repaired individual (``OnesParams.min_hold_s``).
        self.lock: np.ndarray | None = None
        # (J,) jobs the search never removes (``OnesParams.immune_epochs``); set by the search.
        self.immune = np.zeros(len(caps), dtype=bool)
        self.change_cost, self.submit = change_cost, submit
        J = len(caps)
        self.idx = np.arange(J)
        # Time alone at 1 GPU: serves as "shortest remaining first" order for queued jobs.
        self.t1 = remaining / np.maximum(table[:, 1], 1e-12)
        self.srt_order = np.lexsort((submit, self.t1))
        # Best count per job: the one minimising solo run time... weighted by GPUs (cheap, efficient).
        n = np.arange(table.shape[1])
        with np.errstate(divide="ignore"):
            run = np.where(n[None, :] > 0, remaining[:, None] / np.maximum(table, 1e-12), np.inf)
        run[n[None, :] > caps[:, None]] = np.inf
        self.run_time = run  # (J, N+1)
        # A queued job is assumed to start on its requested GPUs (capped) once that many are free.
        self.need = np.clip(requested, 1, caps)
        self.t_need = run[self.idx, self.need]
        self.ref_rate = np.maximum(table[self.idx, self.need], 1e-12)
        counts = np.arange(1, table.shape[1])
        self.best_rate_per_gpu = np.maximum((table[:, 1:] / counts[None, :]).max(axis=1), 1e-12)
        # The most goodput each job can reach (at any count up to its cap): ``tail_chain``'s fastest time.
        self.max_rate = np.maximum(np.where(n[None, :] <= caps[:, None], table, 0.0).max(axis=1), 1e-12)

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

    def job_costs(self) -> np.ndarray:
        """(J, N + 1) each job's term of the fitness when it is scheduled on n GPUs (its predicted
        completion plus its share of the GPU-time cost; inf at n = 0 and above its cap). Scheduled jobs'
        terms do not depend on one another, so an individual with every job scheduled has fitness
        ``job_costs()[idx, counts].sum()``."""
        N = self.table.shape[1] - 1
        pop = np.repeat(np.arange(1, N + 1)[:, None], len(self.caps), axis=1)  # (N, J): all jobs at n
        completion, excess = self._job_terms(pop)
        cost = completion + self.gpu_time_weight * excess / self.G
        out = np.full((len(self.caps), N + 1), np.inf)
        out[:, 1:] = np.where(pop <= self.caps[None, :], cost, np.inf).T
        return out

    def marginal_greedy(self) -> np.ndarray:
        """A seed individual: 1 GPU per job shortest-remaining first, then the free GPUs go, one step at a
        time, to the job whose fitness term (``job_costs``) falls the most per added GPU, while a step
        lowers it. A step may add several GPUs at once, so a gain beyond a bump (the count a job holds
        now, which saves its restart; a node boundary) is found; only the steps that still fit are
        considered."""
        J = len(self.caps)
        counts = self._one_each()
        free = self.G - int(counts.sum())
        if free <= 0:
            return counts
        cost = self.job_costs()
        n = np.arange(cost.shape[1])[None, :]
        gain = np.full(J, -np.inf)  # best fitness drop per added GPU of each job's best step
        to = counts.copy()  # the count that step leads to

        def best_steps(rows: np.ndarray) -> None:
            c = counts[rows][:, None]
            ok = (c > 0) & (n > c) & (n <= np.minimum(self.caps[rows][:, None], c + free))
            with np.errstate(invalid="ignore"):
                per = (cost[rows, counts[rows]][:, None] - cost[rows]) / np.maximum(n - c, 1)
            per = np.where(ok, per, -np.inf)
            to[rows] = np.argmax(per, axis=1)
            gain[rows] = per[np.arange(len(rows)), to[rows]]

        best_steps(np.arange(J))
        while free > 0:
            j = int(np.argmax(gain))
            if not gain[j] > 0:
                break
            free -= int(to[j] - counts[j])
            counts[j] = to[j]
            # Recompute the grown job and every job whose best step no longer fits (the others' best
            # steps are unchanged: the steps that still fit include them).
            best_steps(np.flatnonzero((self.idx == j) | ((gain > -np.inf) & (to - counts > free))))
        return counts

    def repair(self, pop: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Make every individual feasible (sum <= G, 0 <= n <= cap), then pad the free GPUs.

        Vectorised over the population. Over-full individuals keep jobs shortest-remaining first
        while they fit (the one that overflows shrinks); padding gives queued jobs GPUs
        shortest-remaining first (1 each, or their request), then lets scheduled jobs double while
        that shortens them and GPUs remain.
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
        run_o = self.run_time[order]  # (J, N+1)
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

    def fitness(self, pop: np.ndarray, rate: np.ndarray | None = None) -> np.ndarray:
        """(P,) predicted sum of completion times (s from now) of all jobs; lower is better.

        ``rate`` (P, J), when given, is each job's goodput on the GPUs a real placement gives it (for a
        queued job: where it starts; 0: not known), ``OnesPolicy``'s placement re-score; where positive it
        replaces the table's consolidated-placement goodput.

        A job that finishes within the horizon ``H`` counts its predicted finish time. A job still
        running at ``H`` counts ``H`` plus its leftover work at its reference goodput (on its requested
        GPUs): this round's choice only decides how much progress it makes before ``H``, because its
        allocation will be revisited long before it finishes. Without the horizon, shrinking a long job
        would be charged as if it stayed small until the end, and long jobs would hog the cluster.
        """
        completion, excess = self._job_terms(pop, rate)
        total = completion.sum(axis=1)
        if self.gpu_time_weight > 0:
            total = total + self.gpu_time_weight * excess.sum(axis=1) / self.G
        return total

    def _job_terms(self, pop: np.ndarray, placed_rate: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(P, J) each job's predicted completion (s from now) and GPU-seconds spent beyond its most
        GPU-efficient size (``fitness``); the second is 0 with ``gpu_time_weight`` 0. ``placed_rate``: see
        ``fitness``."""
        P, J = pop.shape
        H = self.horizon_s
        on = pop > 0
        cost = np.where((pop != self.cur[None, :]) & on, self.change_cost[None, :], 0.0)
        # A running job shrunk now will most likely grow back later: a second restart.
        cost = np.where(on & (pop < self.cur[None, :]), cost * self.shrink_cost_factor, cost)
        run = self.run_time[self.idx[None, :], pop]  # (P, J); inf where n = 0
        rate = self.table[self.idx[None, :], np.where(on, pop, self.need[None, :])]  # goodput while running
        if self.cur_rate is not None:
            kept = on & (pop == self.cur[None, :]) & (self.cur_rate[None, :] > 0)
            rate = np.where(kept, self.cur_rate[None, :], rate)
            run = np.where(kept, self.remaining[None, :] / np.maximum(rate, 1e-12), run)
            if self.start_on_freed:  # a job started now runs on the GPUs there are, not on ideal ones
                started = on & (self.cur[None, :] == 0)
                rate = np.where(started, rate * self.freed_quality(pop)[:, None], rate)
                run = np.where(started, self.remaining[None, :] / np.maximum(rate, 1e-12), run)
        if placed_rate is not None:
            placed = placed_rate > 0
            rate = np.where(placed, placed_rate, rate)
            run = np.where(on & placed, self.remaining[None, :] / np.maximum(rate, 1e-12), run)
        finish = np.where(on, cost + run, np.inf)
        start = np.where(on, cost, self._queue_start(pop, finish) + self.change_cost[None, :])
        n_eff = np.where(on, pop, self.need[None, :])
        done_by = start + self.remaining[None, :] / np.maximum(rate, 1e-12)
        left = self.remaining[None, :] - rate * np.clip(H - start, 0.0, None)
        left = np.maximum(left, 0.0)
        late = left / self.ref_rate[None, :]
        if self.tail_chain:
            a = self.tail_chain_plain
            late = (1.0 - a) * self._chain_tail(left, done_by > H) + a * late
        elif self.tail_srpt:
            late = np.maximum(late, self._srpt_tail(np.where(done_by > H, left, np.inf)))
        if self.hesrpt is not None and self.hesrpt_scope == "late":
            late = late * self._late_weights(late, done_by > H)
        late = H + late
        completion = np.where(done_by <= H, done_by, late)
        if self.hesrpt is not None and self.hesrpt_scope == "all":
            completion = completion * self.job_weights()[None, :]
        if self.wait_weights is not None:
            completion = completion * self.wait_weights[None, :]
        if self.gpu_time_weight <= 0:
            return completion, np.zeros_like(completion)
        # Opportunity cost of inefficient scaling within the horizon: GPU-seconds spent beyond what the
        # same progress costs at the job's most GPU-efficient size delay queued and future jobs.
        busy = np.clip(np.minimum(done_by, H) - start, 0.0, None)
        progress = rate * busy
        used = n_eff * (busy + np.where(on, start, 0.0))  # a scheduled job holds GPUs while restarting
        ref = progress / self.best_rate_per_gpu[None, :]
        return completion, np.maximum(used - ref, 0.0)

    def freed_quality(self, pop: np.ndarray) -> np.ndarray:
        """(P,) how well the GPUs a job started by each individual can get are placed, as a fraction of the
        table's consolidated goodput (``OnesParams.start_on_freed``): the GPUs free now count 1 each, those the
        individual frees by stopping or shrinking a running job count that job's real goodput over the table's
        at the count it holds (below 1 when its GPUs are split over more nodes than needed); the mean over
        them (1 when none are free). A job started in a swap for a job on split GPUs gets those same GPUs, so
        without this the fitness would value it on ideal ones while it values the kept job on its real ones."""
        held = self.cur > 0
        ratio = self._held_quality
        if ratio is None:  # the same every fitness call of a decision: once
            ref = self.table[self.idx, np.minimum(self.cur, self.table.shape[1] - 1)]
            ok = held & (self.cur_rate > 0) & (ref > 0)
            ratio = np.divide(self.cur_rate, ref, out=np.ones(len(self.cur)), where=ok)
            ratio = self._held_quality = np.minimum(ratio, 1.0)
        freed = np.where(held[None, :] & (pop < self.cur[None, :]), self.cur[None, :] - pop, 0)  # (P, J)
        free_now = float(max(self.G - int(self.cur.sum()), 0))
        total = free_now + freed.sum(axis=1)
        return np.where(total > 0, (free_now + (freed * ratio[None, :]).sum(axis=1)) / np.maximum(total, 1.0), 1.0)

    def _hesrpt_exponent(self) -> np.ndarray:
        """(J,) the speedup exponent ``p`` of ``hesrpt``: the option's number, or each job's own
        (``scaling_exponent``) for "auto"; clipped to [0, 0.98]."""
        if self.hesrpt == "auto":
            return np.clip(self.scaling_exponent(), 0.0, 0.98)
        return np.full(len(self.caps), min(max(float(self.hesrpt), 0.0), 0.98))

    def _late_weights(self, late: np.ndarray, is_late: np.ndarray) -> np.ndarray:
        """(P, J) ``hesrpt_scope`` "late": the factor on each late job's leftover time (at its requested
        count). When every job speeds up as ``n ** p``, the least sum of completion times of jobs all present
        (heSRPT, Berg et al. 2020) is ``sum_k w_k u_k / G ** p`` over their work at one GPU ``u`` (here the
        leftover time x ``request ** p``) ranked largest first (k = 1 .. M), ``w_k`` from ``_hesrpt_w``. So a
        late job's leftover counts ``w_k (request / G) ** p`` times instead of once: the shortest late jobs'
        progress is worth the most, as under SRPT, softened by how well jobs scale (p = 0: every factor 1;
        p -> 1: SRPT's weights 1 .. M)."""
        p = self._hesrpt_exponent()[None, :]
        u = np.where(is_late, late * self.need[None, :] ** p, -np.inf)  # jobs done by the horizon rank last
        return np.where(is_late, self._ranked_weights(u, p), 1.0)

    def _ranked_weights(self, u: np.ndarray, p: np.ndarray) -> np.ndarray:
        """(P, J) ``w_k (request / G) ** p`` with ``k`` each job's rank in its row of ``u`` (work at one GPU),
        largest first."""
        ranks = np.empty(u.shape)
        order = np.argsort(-u, axis=1, kind="stable")
        np.put_along_axis(ranks, order, np.broadcast_to(np.arange(1.0, u.shape[1] + 1), u.shape), axis=1)
        return _hesrpt_w(ranks, p) * (self.need[None, :] / max(self.G, 1)) ** p

    def job_weights(self) -> np.ndarray:
        """(J,) ``hesrpt_scope`` "all": each job's weight in a weighted sum of completion times, its heSRPT
        marginal value ``w_k (request / G) ** p`` (``_late_weights``) with every active job ranked by its
        remaining time at its requested count x ``request ** p`` (largest first), raised to at least
        ``hesrpt_floor`` x the largest weight. Computed once a decision."""
        if self._weights is None:
            p = self._hesrpt_exponent()[None, :]
            self._weights = self._ranked_weights(self.remaining / self.ref_rate * self.need ** p, p)[0]
            if self.hesrpt_floor > 0 and self._weights.size:  # no job counts less than this share of the most
                self._weights = np.maximum(self._weights, self.hesrpt_floor * self._weights.max())
        return self._weights

    def scaling_exponent(self) -> np.ndarray:
        """(J,) each job's speedup exponent ``p`` (goodput ~ n ** p) between its requested count (at most half
        the most it may hold) and the most it may hold, from the goodput table; 0.5 for a job capped at 1."""
        hi = np.minimum(self.caps, self.G)
        lo = np.maximum(np.minimum(self.need, hi // 2), 1)
        g_lo = np.maximum(self.table[self.idx, lo], 1e-12)
        g_hi = np.maximum(self.table[self.idx, hi], 1e-12)
        with np.errstate(divide="ignore", invalid="ignore"):
            p = np.log(g_hi / g_lo) / np.log(np.maximum(hi, 1) / lo)
        return np.where(hi > lo, np.clip(p, 0.0, 1.0), 0.5)

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

    def _srpt_tail(self, left: np.ndarray) -> np.ndarray:
        """(P, J) the earliest time after the horizon at which each job still running there can finish when
        the cluster serves the late jobs' leftover GPU-time (``left``: leftover work, inf for jobs done by
        the horizon; GPU-time at the requested count's per-GPU goodput) least first: the fluid form of
        shortest-remaining-first. The fitness takes the later of this and the job's own time at its
        requested count, so where late jobs' requests oversubscribe the cluster, a job's progress before
        the horizon also shortens the completion of the late jobs behind it (valued alone, each job's term
        only sums speedups)."""
        return self._served_least_first(left * (self.need / self.ref_rate)[None, :])  # GPU-s at the request

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


def _hesrpt_w(ranks: np.ndarray, p: np.ndarray) -> np.ndarray:
    """heSRPT's weight ``(k ** a - (k - 1) ** a) ** (1 / a)`` of rank ``k`` (1: the largest job), ``a = 1 / (1 - p)``,
    written as ``k (1 - (1 - 1 / k) ** a) ** (1 / a)`` so that large ``a`` does not overflow; 1 at p = 0."""
    a = 1.0 / (1.0 - p)
    return ranks * (1.0 - (1.0 - 1.0 / ranks) ** a) ** (1.0 / a)


def keep_unless_better(ctx: OnesContext, best: np.ndarray) -> np.ndarray:
    """(J,) ``best`` with, one job at a time, each change it makes to a running job's count undone while that
    leaves the fitness no worse (feasible undos only; the one that lowers the fitness most first). Starts of
    queued jobs stay: the fitness lets a queued job start at once on free GPUs, so leaving one queued can
    look as good as starting it, and the job would never start. The
    search is random and short, so its fittest individual can carry changes that buy nothing, and one round
    undoes what the previous one did: a job flipping between two counts pays a restart every round."""
    best = best.copy()
    value = float(ctx.fitness(best[None])[0])
    for _ in range(len(best)):
        changed = np.flatnonzero((best != ctx.cur) & (ctx.cur > 0))
        if not changed.size:
            break
        cands = np.repeat(best[None], len(changed), axis=0)
        cands[np.arange(len(changed)), changed] = ctx.cur[changed]
        ok = cands.sum(axis=1) <= ctx.G
        if not ok.any():
            break
        cands = cands[ok]
        fit = ctx.fitness(cands)
        k = int(np.argmin(fit))
        if fit[k] > value:
            break
        best, value = cands[k], float(fit[k])
    return best


def transfer(pop: np.ndarray, caps: np.ndarray, rng: np.random.Generator, p: float) -> np.ndarray:
    """``pop`` where each row, with probability ``p``, moves one GPU from a random scheduled job to a
    random other job below its cap: the fine step between allocations of the same total that the x2 / /2
    resizes (and the repair's padding) cannot make."""
    P, J = pop.shape
    if p <= 0 or J < 2:  # no draw at all: transfer_p 0 leaves the generator's stream as it was
        return pop
    rows = np.flatnonzero(rng.random(P) < p)
    if not rows.size:
        return pop
    sub = pop[rows]
    r = np.arange(len(rows))
    donor = np.argmax(np.where(sub > 0, rng.random(sub.shape), -1.0), axis=1)
    room = sub < caps[None, :]
    room[r, donor] = False
    recv = np.argmax(np.where(room, rng.random(sub.shape), -1.0), axis=1)
    ok = (sub[r, donor] > 0) & room[r, recv]
    out = pop.copy()
    out[rows[ok], donor[ok]] -= 1
    out[rows[ok], recv[ok]] += 1
    return out


def fitted_variants(gpn: int, ctx: OnesContext, counts: np.ndarray, placed: Sequence[tuple[int, ...]]) -> np.ndarray:
    """(V, J) variants of ``counts`` whose placement ``placed`` (GPUs per node of each job, largest first)
    spreads some jobs over more nodes than ``ceil(n / node size)``: each such job (one at a time, then
    all together) gets instead what its placement holds on that many nodes, or keeps the GPUs it holds
    (if it holds any: a job sent back to the queue would look free, see ``_placement_rescore``)."""
    spread = [i for i, n in enumerate(counts) if n > 0 and len(placed[i]) > -(-int(n) // gpn)]
    fitted = {i: sum(placed[i][:-(-int(counts[i]) // gpn)]) for i in spread}
    rows = []
    for alt in (fitted, {i: int(ctx.cur[i]) for i in spread if ctx.cur[i] > 0}):
        for group in [[i] for i in alt] + ([list(alt)] if len(alt) > 1 else []):
            row = counts.copy()
            row[group] = [alt[i] for i in group]
            rows.append(row)
    out = np.array(rows, dtype=np.int64).reshape(-1, len(counts))
    return out[(out.sum(axis=1) <= ctx.G) & (out <= ctx.caps[None, :]).all(axis=1)]
