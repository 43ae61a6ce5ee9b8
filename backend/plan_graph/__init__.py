"""The op graph of a plan's program, one module scope at a time (the graph view's data).

Pure functions over the worker's artifacts (`program`, `placements`, the plan summary); no
database and no HTTP, so they are tested on a plan built in-process.

`index.GraphIndex.build(program, placements, fallback_ops)` indexes the program once: producer and
consumers of every value, each op's *view scope* and the module tree. `scope_view(index,
scope)` is then one scope's graph and `search(index, q)` finds ops, values, collectives and
modules by name.

View scopes. Forward and backward ops carry the scope of their module (`layers.3.attn`).
Ops the program leaves unscoped (optimizer updates, gradient sums, data-parallel buckets, the
loss seed) are shown where their data lives (`GraphIndex._place`): with the value they sum
the gradient of, with the parameter they update (where its first reader is, as in
`backend.module_tree`), else at the common scope of the ops reading what they write or
writing what they read. An op whose data spans several layers (`layers.3`, `layers.4`)
stays above the layer list; an op nothing anchors stays at the root. Each op keeps its
program scope too (`scope`, beside `shown_in`).
Communication ops are not nodes: each is a badge on the edge from the op that produced its
input (followed back through a chain of comm ops) to the ops that consume its output.

Nodes of a scope: its child modules, and its own ops. Consecutive numbered children of one
structure fold into one node with `repeat: N` (`backend.module_tree`'s rule); a child list
that is nothing but one such run (`layers` holding `layers.0` .. `layers.31`) is that node
itself. Expanding a folded node opens its first member (`layers.0`), the representative.
A child module holding a single op is drawn as that op.

Modules: `index` (GraphIndex: links, view scopes, the module tree), `scope_view` (one
scope's nodes and edges), `search`, `op_detail` (one op with shapes, for the side panel).
"""
