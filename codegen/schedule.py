"""From an IR graph to kernels: decide which nodes get a buffer (materialize) and inline the rest
into the kernels that read them, resolving views into index expressions.

A node gets a buffer when it is an output, a reduction, a slice update, or an elementwise result
that would be recomputed (read by several kernels, or broadcast) and whose inlined cost (ops in
its cone) exceeds the policy's limit. The limits are a search knob (see FusionPolicy)."""
from __future__ import annotations

import itertools

from dataclasses import dataclass, field

from ..ir.dtypes import DType, accumulator
from ..ir.graph import Graph, Node, positional, toposort
from ..ir.interpret import contracted_product
from ..ir.ops import ELEMENTWISE, IOTA_INDEX, REDUCE, VIEWS, Op
from ..ir.symbolic import Expr, prod, sym
from .attention import as_attention
from .heads import split_by_heads
from .index import interval, linear, reshape_index, substitute
from .kernel import Apply, Bind, BufferArg, Const, InRange, IndexValue, Kernel, Load, Reduce, Scalar, load_counts, nodes
from .merged import MERGED_READERS, combined, merged_well, rows_well, sums_partials_well
from .packing import Packing
from .policy import FusionPolicy


_ROUNDED = (DType.BF16, DType.F16)



@dataclass
class Buffer:
    name: str
    dtype: DType
    shape: tuple[Expr, ...]
    role: str                       # "input", "weight", "temp"
    source: str = ""                # the input's or weight's name

    @property
    def size(self) -> Expr:
        return prod(self.shape)


@dataclass
class Program:
    """Kernels in launch order over named buffers. `outputs[i]` is the buffer holding graph
    output i; `aliases` maps an output buffer written in place to the input buffer it reuses."""
    buffers: dict[str, Buffer]
    kernels: list[Kernel]
    outputs: list[str]
    inputs: list[str]
    weights: dict[str, str]                          # buffer -> weight name
    symbols: dict[str, tuple[int, int]]
    aliases: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, Node] = field(default_factory=dict)   # buffer -> the IR node it holds
    packings: dict[str, Packing] = field(default_factory=dict)   # weight name -> its packed copy's make


def schedule(graph: Graph, policy: FusionPolicy = FusionPolicy()) -> Program:
    graph, partials, packings = split_by_heads(graph) if policy.heads else (graph, set(), {})
    program = _Scheduler(graph, policy, partials).run()
    program.packings = packings
    return program


class _Scheduler:
    def __init__(self, graph: Graph, policy: FusionPolicy, partials: set[int] = frozenset()):
        self.graph, self.policy, self.partials = graph, policy, partials
        self.order = toposort(graph.outputs)
        self.positional = positional(self.order)
        self.users: dict[int, list[Node]] = {}
        for node in self.order:
            for i in node.inputs:
                self.users.setdefault(id(i), []).append(node)
        self.bounds = {name: (lo, hi) for name, (lo, hi) in graph.symbols.items()}
        self.probe = {name: max(lo, min(hi, 7)) for name, (lo, hi) in graph.symbols.items()}
        self.buffers: dict[str, Buffer] = {}
        self.buffer_of: dict[int, str] = {}
        self.counter = 0

    # --- what gets a buffer -------------------------------------------------------------------
    def run(self) -> Program:
        inputs = [self._buffer(n, "input", n.attrs["name"]) for n in self.graph.inputs]
        weights = {}
        for n in self.order:
            if n.op is Op.INPUT and n.attrs["role"] == "weight":
                weights[self._buffer(n, "weight", n.attrs["name"])] = n.attrs["name"]
        roots = self._roots()
        kernels, aliases = [], {}
        for node in self.order:
            if id(node) in roots:
                name = self._buffer(node, "temp")
                kernel, alias = self._kernel(node, name)
                kernels.append(kernel)
                if alias:
                    aliases[name] = alias
        if self.policy.merges:
            kernels = combined(kernels, aliases)
        outputs = [self.buffer_of[id(n)] for n in self.graph.outputs]
        nodes = {name: n for n in self.order if (name := self.buffer_of.get(id(n)))}
        return Program(self.buffers, kernels, outputs, inputs, weights, dict(self.graph.symbols),
                       aliases, nodes)

    def _roots(self) -> set[int]:
        roots = {id(n) for n in self.graph.outputs if n.op is not Op.INPUT}
        cost: dict[int, int] = {}
        broadcast: set[int] = set()
        for node in reversed(self.order):      # consumers first: broadcast flows to producers
            if node.op is Op.EXPAND and node.inputs[0].shape != node.shape or (
                    node.op in VIEWS and id(node) in broadcast):
                broadcast.update(id(i) for i in node.inputs)
        for node in self.order:
            if node.op in REDUCE or node.op is Op.SLICE_UPDATE:
                roots.add(id(node))
            # a value computed from positions alone (a causal mask) is recomputed by each reader
            # from its indices, never stored: index arithmetic costs less than reading it
            if node.op in (Op.INPUT, Op.CONSTANT, Op.IOTA) or id(node) in roots or id(node) in self.positional:
                cost[id(node)] = 0
                continue
            own = 0 if node.op in VIEWS else 1
            cost[id(node)] = own + sum(cost[id(i)] for i in node.inputs)
            if node.op in ELEMENTWISE or node.op is Op.GATHER:
                limit = (self.policy.broadcast_limit if id(node) in broadcast else
                         self.policy.inline_limit if len(self.users.get(id(node), ())) > 1 else None)
                if limit is not None and cost[id(node)] > limit:
                    narrow = _narrow_source(node)
                    if narrow is not None and narrow.op not in (Op.INPUT, Op.CONSTANT, Op.IOTA):
                        # store the value before it is widened (bf16, not its f32 copy): half the
                        # bytes, and a matrix product of two bf16 operands can run as one cuBLAS
                        # call; the reader widens it, exactly
                        roots.add(id(narrow))
                        cost[id(node)] = 1
                        if cost[id(node)] <= limit:
                            continue
                    roots.add(id(node))
                    cost[id(node)] = 0
        if self.policy.epilogues:
            roots -= self._epilogue_reductions(roots)
        if self.policy.merges:
            roots = self._merge_reductions(roots)
        if self.policy.rows:
            roots = self._permuted_stores(self._merge_rows(roots))
        if self.policy.attention:
            roots = self._merge_attention(roots)
        if self.partials:
            roots = self._merge_heads(roots)
        return roots

    def _merge_heads(self, roots: set[int]) -> set[int]:
        """Each head's partial of the output projection (codegen/heads.py) takes in the kernels
        behind it that only it reads (all but the caches' updates, which its keys and values read
        whole, and what other kernels read: the norm the keys' projection shares); the partials'
        sum then merges into the kernels reading it."""
        outputs = {id(n) for n in self.graph.outputs}
        for partial in self.order:
            if id(partial) not in self.partials or id(partial) not in roots:
                continue
            behind = {id(n) for n in toposort([partial])} - {id(partial)}
            block: set[int] = set()
            for node in reversed(self.order):        # readers first
                if (id(node) in behind and id(node) in roots and id(node) not in outputs
                        and node.op is not Op.SLICE_UPDATE
                        and all(r is partial or id(r) in block for r in self._reader_kernels(node, roots))):
                    block.add(id(node))
            roots = roots - block
            total = self.users[id(partial)][0]
            if id(total) in roots and id(total) not in outputs:
                readers = self._reader_kernels(total, roots)
                trial = roots - {id(total)}
                if 0 < len(readers) <= MERGED_READERS and all(
                        sums_partials_well(self._trial_kernel(reader, trial)) for reader in readers):
                    roots = trial
        return roots

    def _merge_attention(self, roots: set[int]) -> set[int]:
        """Each product fused attention can take whole: the wide kernels behind it (up to 16-bit
        values, which get kernels of their own if they had none) go into it, where nothing else
        reads them and `as_attention` recognizes the result."""
        outputs, made = {id(n) for n in self.graph.outputs}, set()
        for node in self.order:
            if id(node) not in roots or node.op is not Op.SUM_REDUCE:
                continue
            # with its epilogue (attention's cast, permuted; or the row factor softmax normalizes
            # by after the product) where one elementwise kernel reads it, else alone
            readers = self._reader_kernels(node, roots)
            epilogue = [readers[0]] if (id(node) not in outputs and len(readers) == 1
                                        and readers[0].op not in REDUCE) else []
            # bounded where 16-bit values are, else (an f32 model) by the keys' extent
            keys = node.inputs[0].shape[node.attrs["axis"]]
            for root, bound in itertools.product((*epilogue, node), (None, keys)):
                wide, narrow = self._wide_behind(root, roots, bound)
                if not wide or wide & outputs:
                    continue
                trial = (roots - wide) | narrow
                if any(self._reader_kernels(w, trial) != [root] for w in self.order if id(w) in wide):
                    continue
                if as_attention(self._trial_kernel(root, trial)) is not None:
                    made |= trial - roots
                    roots = trial
                    break
        # an f32 attention's boundaries are kernels only now (the query's rotary): the products
        # they read merge into them as into a 16-bit model's rounding kernels
        return self._merge_reductions(roots, into=made) if made and self.policy.merges else roots

    def _wide_behind(self, root: Node, roots: set[int], keys=None) -> tuple[set[int], set[int]]:
        """The kernels (roots) `root` reads, directly or through others, that hold no 16-bit value
        (or one computed from positions, a causal mask), stopping at 16-bit values: those (the
        first node past views) are the second set. An f32 model rounds nowhere: given `keys` (the
        extent the product sums over), the walk stops instead at the operands of the scores'
        product (a product over another extent), at the caches' updates and at a kernel that a
        kernel the walk does not reach reads too (the mask every layer's attention reads; not the
        scores, which softmax's maximum and sum read beside P.V). The root's own views and casts
        (its store's rounding) are its, not a boundary."""
        if keys is None:
            return self._walk_wide(root, roots, None, None)[:2]
        reached = self._walk_wide(root, roots, keys, None)[2] | {id(root)}
        return self._walk_wide(root, roots, keys, reached)[:2]

    def _walk_wide(self, root: Node, roots: set[int], keys, reached: set[int] | None):
        """_wide_behind's walk, and the nodes it visited; `reached`: the nodes a walk through
        every shared kernel visits, where a kernel read by one outside them is a boundary."""
        start = root
        while start.op in VIEWS or start.op is Op.CAST:
            start = start.inputs[0]
        wide, narrow, seen = set(), set(), set()

        def bound(node: Node) -> None:
            node = _past_views(node)
            while keys is not None and node.op is Op.MUL:
                # an operand scaled by a constant (attention takes the scale whole)
                bare = [i for i in node.inputs if _past_views(i).op is not Op.CONSTANT]
                if len(bare) != 1:
                    break
                node = _past_views(bare[0])
            if node.op not in (Op.INPUT, Op.CONSTANT):
                narrow.add(id(node))

        stack = list(root.inputs) if start is root else [start]
        while stack:
            node = stack.pop()
            if id(node) in seen or node.op in (Op.INPUT, Op.CONSTANT, Op.IOTA):
                continue
            seen.add(id(node))
            if node.dtype in _ROUNDED and id(node) not in self.positional:   # a mask is computed inline
                bound(node)
                continue
            if keys is not None and id(node) in roots and (node.op is Op.SLICE_UPDATE or (
                    reached is not None and any(id(r) not in reached for r in self._reader_kernels(node, roots)))):
                narrow.add(id(node))
                continue
            if id(node) in roots:
                if node.op is Op.SLICE_UPDATE:
                    return set(), set(), seen
                wide.add(id(node))
            product = node.inputs[0] if node.op is Op.SUM_REDUCE else None
            if (keys is not None and product is not None and product.op is Op.MUL
                    and product.shape[node.attrs["axis"]] != keys):
                for operand in product.inputs:
                    bound(operand)
                continue
            stack.extend(node.inputs)
        return wide, narrow, seen

    def _permuted_stores(self, roots: set[int]) -> set[int]:
        """An elementwise value read only through one permutation is stored permuted: attention's
        output, [head, position, d], stored as [position, head, d], so that the output projection
        reads whole rows (one library call, no copy first)."""
        outputs = {id(n) for n in self.graph.outputs}
        for node in self.order:
            users = self.users.get(id(node), [])
            if (id(node) in roots and id(node) not in outputs and node.op in ELEMENTWISE
                    and len(users) == 1 and users[0].op is Op.PERMUTE):
                roots = (roots - {id(node)}) | {id(users[0])}
        return roots

    def _merge_rows(self, roots: set[int]) -> set[int]:
        """Drop from `roots` each reduction, and each per-row value (its last axis of length one),
        that every kernel reading it computes once per row; again while one goes (the norm's sum
        merges once the reciprocal reading it has)."""
        outputs = {id(n) for n in self.graph.outputs}
        changed = True
        while changed:
            changed = False
            for node in self.order:
                per_row = node.op in ELEMENTWISE and node.rank > 0 and node.shape[-1] == 1
                if id(node) not in roots or id(node) in outputs or not (node.op in REDUCE or per_row):
                    continue
                readers = self._reader_kernels(node, roots)
                trial = roots - {id(node)}
                if 0 < len(readers) <= MERGED_READERS and all(
                        rows_well(self._trial_kernel(reader, trial)) for reader in readers):
                    roots, changed = trial, True
        return roots

    def _merge_reductions(self, roots: set[int], into: set[int] | None = None) -> set[int]:
        """Drop from `roots` each reduction that every kernel reading it can compute once per point
        (producers first, so a chain merges link by link: softmax's max, then the sum reading it);
        `into`: only where those kernels are among these."""
        outputs = {id(n) for n in self.graph.outputs}
        for node in self.order:
            mergeable = node.op in REDUCE or node.op in ELEMENTWISE
            if not mergeable or id(node) not in roots or id(node) in outputs:
                continue
            readers = self._reader_kernels(node, roots)
            if into is not None and not all(id(r) in into for r in readers):
                continue
            trial = roots - {id(node)}
            if 0 < len(readers) <= MERGED_READERS and all(
                    merged_well(kernel := self._trial_kernel(reader, trial), splittable=self.policy.rows)
                    and (self.policy.rereads or not self._rereads_weights(kernel)) for reader in readers):
                roots = trial
        return roots

    def _rereads_weights(self, kernel: Kernel) -> bool:
        """Whether the kernel, over all its points, reads more of a weight's point-selected rows
        than the weight holds: a merge that computes, at each point, a product another point
        computes too (the rotary's partner row: every row of the projection read twice, a
        memory-bound GEMV at half speed). Rows every point shares (a norm's scale) don't count."""
        reads = load_counts(kernel, self.probe, point_rows=True)
        return any(b.role == "weight" and reads.get(name, 0) > b.size.evaluate(self.probe)
                   for name, b in self.buffers.items())

    def _reader_kernels(self, node: Node, roots: set[int]) -> list[Node]:
        """The kernels (roots) whose values read `node`'s, directly or through inlined nodes."""
        found, stack, seen = {}, list(self.users.get(id(node), [])), set()
        while stack:
            user = stack.pop()
            if id(user) in seen:
                continue
            seen.add(id(user))
            if id(user) in roots:
                found[id(user)] = user
            else:
                stack.extend(self.users.get(id(user), []))
        return list(found.values())

    def _trial_kernel(self, root: Node, roots: set[int]) -> Kernel:
        """`root`'s kernel were `roots` the kernels; the scheduler's state is left as it was."""
        state = dict(self.buffers), dict(self.buffer_of), dict(self.bounds)
        try:
            for node in self.order:
                if id(node) in roots:
                    self._buffer(node, "temp")
            return self._kernel(root, self.buffer_of[id(root)])[0]
        finally:
            self.buffers, self.buffer_of, self.bounds = state

    def _epilogue_reductions(self, roots: set[int]) -> set[int]:
        """Reductions that can run inside the kernel that reads them: each is read by one chain of
        single-reader elementwise ops and point-preserving views ending at a kernel that is no
        reduction itself, visits every point of it once (no broadcast, no pad), and takes in no
        other such reduction (a kernel holds one reduction at its points, the one a group of
        threads shares on the GPU)."""
        outputs = {id(n) for n in self.graph.outputs}
        fused: dict[int, int] = {}          # kernel root -> the reduction fused into it
        for node in self.order:
            if node.op not in REDUCE or id(node) in outputs:
                continue
            current = node
            while True:
                readers = self.users.get(id(current), [])
                if len(readers) != 1 or not _keeps_points(readers[0], current):
                    break
                current = readers[0]
                if id(current) in roots:
                    in_place = current.op is not Op.SLICE_UPDATE or self._in_place_target(current)
                    if current.op not in REDUCE and in_place and id(current) not in fused:
                        fused[id(current)] = id(node)
                    break
        return set(fused.values())

    def _buffer(self, node: Node, role: str, source: str = "") -> str:
        if id(node) in self.buffer_of:
            return self.buffer_of[id(node)]
        name = f"b{len(self.buffers)}"
        self.buffers[name] = Buffer(name, node.dtype, node.shape, role, source)
        self.buffer_of[id(node)] = name
        return name

    # --- one kernel ---------------------------------------------------------------------------
    def _kernel(self, root: Node, out: str) -> tuple[Kernel, str | None]:
        self.reads: dict[str, Buffer] = {}
        self.memo: dict[tuple, Scalar] = {}
        self.fresh = 0
        shape = root.shape
        alias = self._in_place_target(root)
        if alias:
            # write only the slice: loops over the update, the store offset moves by the start
            dst, src, start = root.inputs
            axis = root.attrs["axis"]
            loops, idx = self._loops(src.shape)
            value = self._value(src, idx)
            begin = _clamped(self._value(start, []), dst.shape[axis] - src.shape[axis] + 1)
            var = self._var("g")
            store_idx = list(idx)
            store_idx[axis] = idx[axis] + sym(var)
            value = Bind(var, begin, value, value.dtype)
            store = linear(store_idx, shape)
        else:
            loops, idx = self._loops(shape)
            value = self._value(root, idx, top=True)
            store = linear(idx, shape)
        syms = sorted(set(self.graph.symbols) & _symbols_used(loops, value, store))
        kernel = Kernel(
            output=BufferArg(out, root.dtype, prod(shape)),
            inputs=tuple(BufferArg(b.name, b.dtype, b.size) for b in self.reads.values()),
            loops=tuple(loops), store=store, value=value, symbols=tuple(syms),
            bounds=tuple((s, *self.bounds[s]) for s in syms), label=_label(root))
        return kernel, alias

    def _in_place_target(self, node: Node) -> str | None:
        """A slice update of an input read by nothing else (nor returned, which would return it
        updated) writes into that input's buffer."""
        if node.op is not Op.SLICE_UPDATE:
            return None
        dst = node.inputs[0]
        if (dst.op is Op.INPUT and dst.attrs["role"] == "input" and len(self.users[id(dst)]) == 1
                and not any(o is dst for o in self.graph.outputs)):
            return self.buffer_of[id(dst)]
        return None

    def _loops(self, shape) -> tuple[list[tuple[str, Expr]], list[Expr]]:
        """A loop per axis longer than one; the index of a size-1 axis is 0."""
        loops, idx = [], []
        for n in shape:
            if n == 1:
                idx.append(Expr.of(0))
                continue
            var = self._var("i")
            self.bounds[var] = (0, max(0, _upper(n, self.bounds) - 1))
            loops.append((var, n))
            idx.append(sym(var))
        return loops, idx

    def _var(self, prefix: str) -> str:
        self.fresh += 1
        return f"{prefix}{self.fresh}"

    def _value(self, node: Node, idx: list[Expr], top: bool = False) -> Scalar:
        key = (id(node), tuple(idx))
        if key not in self.memo:
            self.memo[key] = self._compute(node, idx, top)
        return self.memo[key]

    def _load(self, node: Node, idx: list[Expr]) -> Scalar:
        name = self.buffer_of[id(node)]
        self.reads[name] = self.buffers[name]
        return Load(name, linear(idx, node.shape), node.dtype)

    def _compute(self, node: Node, idx: list[Expr], top: bool) -> Scalar:
        op, a = node.op, node.attrs
        if not top and id(node) in self.buffer_of:
            return self._load(node, idx)
        if op in ELEMENTWISE:
            return Apply(op, tuple(self._value(i, idx) for i in node.inputs), node.dtype)
        if op is Op.CONSTANT:
            return Const(a["value"], node.dtype)
        if op is Op.IOTA:
            return IndexValue(substitute(a["expr"], {IOTA_INDEX: idx[0]}), node.dtype)
        if op in REDUCE:
            var, axis = self._var("r"), a["axis"]
            extent = node.inputs[0].shape[axis]
            self.bounds[var] = (0, max(0, _upper(extent, self.bounds) - 1))
            body = self._value(node.inputs[0], idx[:axis] + [sym(var)] + idx[axis:])
            product = contracted_product(node)
            if product is not None and isinstance(body, Apply) and body.op is Op.MUL and body.dtype in _ROUNDED:
                # the interpreter contracts a product as a matrix product does: f16/bf16 products
                # are summed unrounded
                body = Apply(Op.MUL, body.args, accumulator(body.dtype))
            return Reduce(op, var, extent, body, node.dtype)
        if op is Op.GATHER:
            table, index = node.inputs
            axis, k = a["axis"], index.rank
            var = self._var("g")
            self.bounds[var] = (0, max(0, _upper(table.shape[axis], self.bounds) - 1))
            where = self._value(index, idx[axis:axis + k])
            row = self._value(table, idx[:axis] + [sym(var)] + idx[axis + k:])
            return Bind(var, _clamped(where, table.shape[axis]), row, node.dtype)
        if op is Op.SLICE_UPDATE:
            dst, src, start = node.inputs
            axis = a["axis"]
            var = self._var("g")
            self.bounds[var] = (0, max(0, _upper(dst.shape[axis] - src.shape[axis], self.bounds)))
            inside = InRange(idx[axis], sym(var), sym(var) + src.shape[axis])
            shifted = list(idx)
            shifted[axis] = (idx[axis] - sym(var)).max(0).min(src.shape[axis] - 1)
            body = Apply(Op.WHERE, (inside, self._value(src, shifted), self._value(dst, idx)),
                         node.dtype)
            begin = _clamped(self._value(start, []), dst.shape[axis] - src.shape[axis] + 1)
            return Bind(var, begin, body, node.dtype)
        if op in VIEWS:
            return self._view(node, idx)
        raise NotImplementedError(f"no kernel lowering for {op.value}")

    def _concat_of_slices(self, node: Node, idx: list[Expr]) -> Scalar | None:
        """A concat of slices of one value (rotary's rotate-half: its upper half negated, then its
        lower half) reads that value once per point, at the index the point's part takes, instead
        of once per part and a select: a GEMV merged into the rotary then runs once, not twice."""
        axis = node.attrs["axis"]
        parts = [_sliced(part, axis) for part in node.inputs]
        if None in parts or len({id(sl.inputs[0]) for _, sl in parts}) != 1:
            return None
        source = parts[0][1].inputs[0]
        var = self._var("g")
        self.bounds[var] = (0, _upper(source.shape[axis], self.bounds) - 1)
        inner = list(idx)
        inner[axis] = sym(var)
        shared = self._value(source, inner)
        pieces, offset = [], Expr.of(0)
        for part, (chain, sl) in zip(node.inputs, parts):
            local = list(idx)
            local[axis] = (idx[axis] - offset).max(0).min(part.shape[axis] - 1)
            value, below = shared, sl
            for op_node in reversed(chain):       # innermost first, the constants at the part's points
                value = Apply(op_node.op, tuple(value if i is below else self._value(i, local)
                                                for i in op_node.inputs), op_node.dtype)
                below = op_node
            at = IndexValue(local[axis] * sl.attrs["step"] + sl.attrs["start"], DType.I64)
            offset = offset + part.shape[axis]
            pieces.append((offset, value, at))
        _, value, index = pieces[-1]
        for end, piece, at in reversed(pieces[:-1]):
            inside = InRange(idx[axis], Expr.of(0), end)
            value = Apply(Op.WHERE, (inside, piece, value), node.dtype)
            index = Apply(Op.WHERE, (inside, at, index), DType.I64)
        return Bind(var, index, value, node.dtype)

    def _view(self, node: Node, idx: list[Expr]) -> Scalar:
        op, a, x = node.op, node.attrs, node.inputs[0]
        if op is Op.PERMUTE:
            inner = [Expr.of(0)] * x.rank
            for out_axis, in_axis in enumerate(a["perm"]):
                inner[in_axis] = idx[out_axis]
            return self._value(x, inner)
        if op is Op.EXPAND:
            return self._value(x, [Expr.of(0) if n == 1 else i for i, n in zip(idx, x.shape)])
        if op is Op.RESHAPE:
            return self._value(x, reshape_index(idx, node.shape, x.shape, self.bounds, self.probe))
        if op is Op.SLICE:
            inner = list(idx)
            inner[a["axis"]] = idx[a["axis"]] * a["step"] + a["start"]
            return self._value(x, inner)
        if op is Op.PAD:
            axis, before = a["axis"], a["before"]
            inner = list(idx)
            inner[axis] = (idx[axis] - before).max(0).min(x.shape[axis] - 1)
            inside = InRange(idx[axis], before, before + x.shape[axis])
            return Apply(Op.WHERE, (inside, self._value(x, inner), Const(a["value"], node.dtype)),
                         node.dtype)
        if op is Op.CONCAT and self.policy.merges:
            shared = self._concat_of_slices(node, idx)
            if shared is not None:
                return shared
        if op is Op.CONCAT:
            axis, offset = a["axis"], Expr.of(0)
            pieces = []
            for part in node.inputs:
                inner = list(idx)
                inner[axis] = (idx[axis] - offset).max(0).min(part.shape[axis] - 1)
                pieces.append((offset + part.shape[axis], self._value(part, inner)))
                offset = offset + part.shape[axis]
            value = pieces[-1][1]
            for end, piece in reversed(pieces[:-1]):
                value = Apply(Op.WHERE, (InRange(idx[axis], Expr.of(0), end), piece, value),
                              node.dtype)
            return value
        raise NotImplementedError(f"no kernel lowering for view {op.value}")


def _sliced(part: Node, axis: int) -> tuple[list[Node], Node] | None:
    """A concat's part as elementwise ops (outermost first; each takes one computed value, the
    rest constants) over a slice along the concat's axis; None for any other part."""
    chain = []
    while part.op is not Op.SLICE:
        computed = [i for i in part.inputs if not _constant(i)]
        if part.op not in ELEMENTWISE or len(computed) != 1 or computed[0].shape != part.shape:
            return None
        chain.append(part)
        part = computed[0]
    return (chain, part) if part.attrs["axis"] == axis else None


def _constant(node: Node) -> bool:
    while node.op in VIEWS:
        node = node.inputs[0]
    return node.op is Op.CONSTANT


def _keeps_points(reader: Node, value: Node) -> bool:
    """Whether `reader` reads `value` once per point of its own: an elementwise op, a view that
    only renames points, or a slice update's source (written in place, a point per update)."""
    if reader.op in ELEMENTWISE:
        return True
    if reader.op is Op.SLICE_UPDATE:
        return reader.inputs[1] is value and reader.inputs[0] is not value and reader.inputs[2] is not value
    if reader.op is Op.EXPAND:
        return reader.shape == value.shape
    return reader.op in (Op.RESHAPE, Op.PERMUTE, Op.SLICE)


def _clamped(where: Scalar, extent: Expr) -> Scalar:
    """A data-dependent index (a gather's, a slice update's start) clamped into [0, extent): a
    bad token id or position cannot touch memory outside its buffer. Callers check inputs before
    a call; this keeps memory safe regardless."""
    zero = Const(0, where.dtype)
    top = Apply(Op.ADD, (IndexValue(extent, where.dtype), Const(-1, where.dtype)), where.dtype)
    low = Apply(Op.WHERE, (Apply(Op.LESS_THAN, (where, zero), DType.BOOL), zero, where), where.dtype)
    return Apply(Op.WHERE, (Apply(Op.LESS_THAN, (top, low), DType.BOOL), top, low), where.dtype)


def _upper(extent: Expr, bounds) -> int:
    r = interval(extent, bounds)
    if r is None:
        raise ValueError(f"extent {extent} has an unbounded symbol")
    return r[1]


def _symbols_used(loops, value: Scalar, store: Expr) -> set[str]:
    names = set(store.symbols())
    for _, n in loops:
        names |= n.symbols()
    for s in nodes(value):
        for e in (getattr(s, "index", None), getattr(s, "expr", None), getattr(s, "lo", None),
                  getattr(s, "hi", None), getattr(s, "extent", None)):
            if e is not None:
                names |= e.symbols()
    return names


def _narrow_source(node: Node) -> Node | None:
    """For a cast that widens a float (bf16 or f16 to f32), the narrower value it reads, through
    views; None for any other node."""
    if node.op is not Op.CAST or not node.dtype.is_float:
        return None
    source = node.inputs[0]
    while source.op in VIEWS:
        source = source.inputs[0]
    if not source.dtype.is_float or source.dtype.np.itemsize >= node.dtype.np.itemsize:
        return None
    return source


def _label(node: Node) -> str:
    return f"{node.op.value}{[str(d) for d in node.shape]}".replace("'", "")


def _past_views(node: Node) -> Node:
    while node.op in VIEWS:
        node = node.inputs[0]
    return node
