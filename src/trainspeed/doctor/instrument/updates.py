"""Which module each optimizer updates, and over how many micro-batches.

A training iteration may step several optimizers (a GAN's discriminator and generator, an
actor and a critic with optimizers of their own) and run several backward passes per update
that are not micro-batches: a GAN's discriminator update backwards its loss on the real batch
and on the generated one, an actor-critic loop backwards a policy loss and a value loss. The
doctor once counted every backward between two steps of the first optimizer as one micro-batch
(a dcgan loop read "gradient accumulation over 3 micro-batches ... use one micro-batch 3x
larger"). A micro-batch is a new input, so each update counts, since that optimizer's own
previous update:

- the training DataLoader's batches, when the loop fetched any;
- else the training forwards, of each module the optimizer updates, whose input is not the
  output of a module this iteration (a GAN's `netD(fake.detach())` re-reads the generator's
  output): the most of any one module (an actor and a critic reading one state are one), less
  the outputs of other trained models (modules another optimizer updates, this one does not)
  that no module was seen to read: such an output may reach this optimizer's module through a
  plain function
  (devnag's gan_pytorch.py feeds D `preprocess(G(z).detach())`, a new tensor: D's update of a
  real and a fake batch read as 2 micro-batches), and a micro-batch is a new input, not another
  model's output (a teacher no optimizer updates is no such model: its outputs are the loss's).
  At least one;
- else (the forwards ran unseen, compiled) the backward passes;

and never more than the backward passes since (when any ran outside closures): a REINFORCE
episode runs a forward per environment step and one backward over their summed loss
(pytorch/examples' reinforce.py read "gradient accumulation over 100 micro-batches").

All state is bounded: a few optimizers, a few trained modules, a ring of recent outputs.
"""

from __future__ import annotations

import linecache
import re
import weakref
from collections import Counter, deque
from typing import Any

import torch


def module_class(module: Any) -> str:
    """The class a person knows a module by: torch.compile's wrapper by the model it compiled
    (llama2.c's report read "AdamW over OptimizedModule")."""
    inner = getattr(module, "_orig_mod", None) if type(module).__name__ == "OptimizedModule" else None
    return type(inner if inner is not None else module).__name__


def updated_part(module: torch.nn.Module, params: set[int]) -> torch.nn.Module:
    """The part of `module` an optimizer over `params` (ids) updates: the smallest submodule
    that holds every one of them `module` holds, and of the modules holding just those
    parameters, the outermost (a Generator whose one child holds all its weights is the
    Generator). A LightningModule holding a generator and a discriminator, each with its own
    optimizer, is called as the root: both optimizers read "Adam over GAN". A module the
    optimizer updates entirely is itself (a DDP wrapper keeps the name of what the script called)."""
    node = best = module
    wanted = {id(p) for p in module.parameters()} & params
    best_held = {id(p) for p in module.parameters()}
    while True:
        held = {id(p) for p in node.parameters()}
        if held != best_held:  # fewer parameters than its parent's: the first module holding just these
            best, best_held = node, held
        if held <= wanted:
            return best
        for child in node.children():
            if wanted <= {id(p) for p in child.parameters()}:
                node = child
                break
        else:
            return best


MAX_OPTIMIZERS = 16
MAX_MODULES = 16
RECENT_OUTPUTS = 16
"""Outputs of outermost training forwards remembered (weakly): an input that shares one's
storage is a module's output fed on, not a new batch."""

_ASSIGNED = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(?::[^=]*)?=(?!=)\s*(.?)")


def assigned_name(site: tuple[str, int] | None) -> str | None:
    """`optimizerD` from the line `optimizerD = optim.Adam(...)` that built an object; None for
    one built inside a list, tuple or dict literal (`optimizers = [SGD(...), AdamW(...)]`: that
    name is every element's, and the findings named SGD and AdamW alike `optimizers`)."""
    if site is None:
        return None
    match = _ASSIGNED.match(linecache.getline(site[0], site[1]))
    return match.group(1) if match and match.group(2) not in ("[", "(", "{") else None


def _first_tensor(value: Any, depth: int = 0) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if depth < 2 and isinstance(value, (tuple, list)):
        for item in value[:4]:
            found = _first_tensor(item, depth + 1)
            if found is not None:
                return found
    if depth < 2 and isinstance(value, dict):
        for item in list(value.values())[:4]:
            found = _first_tensor(item, depth + 1)
            if found is not None:
                return found
    return None


def _storage(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError, AttributeError):
        return 0


class Updates:
    """Per-optimizer update bookkeeping (see module docstring). Called from the session's
    hooks, which already hold `session.internal`."""

    def __init__(self) -> None:
        self.modules: dict[int, Any] = {}  # id -> weakref of a trainable module seen in a training forward
        self.classes: dict[int, str] = {}  # id -> its class name (the module is gone when the run ends)
        self.fresh: Counter[int] = Counter()  # module id -> forwards on a new input (monotonic)
        self.loader_batches = 0  # training DataLoader batches (monotonic)
        self.backwards = 0  # backward passes outside closures (monotonic)
        self.outputs: deque[list[Any]] = deque(maxlen=RECENT_OUTPUTS)  # [weakref, module id, read since]
        self.produced: Counter[int] = Counter()  # module id -> outputs of its training forwards (monotonic)
        self.read: Counter[int] = Counter()  # module id -> those outputs another forward read (monotonic)
        self.marks: dict[int, tuple[int, int, dict[int, int], dict[int, int]]] = {}  # opt -> counters at its last update
        self.updated: dict[int, tuple[int, list[int]]] = {}  # opt -> (modules known then, module ids)
        self.over: dict[int, list[str]] = {}  # opt -> classes of the parts of those modules it updates
        self.micro: dict[int, Counter[int]] = {}  # opt -> micro-batches per update
        self.built: list[Any] = []  # weakrefs of the optimizers built, stepped or not yet

    # ------------------------------------------------------------ what the hooks see
    def on_forward(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        """An outermost training forward of a module with trainable parameters."""
        key = id(module)
        if key not in self.modules:
            if len(self.modules) >= MAX_MODULES:
                return
            self.modules[key] = weakref.ref(module)
            self.classes[key] = module_class(module)
        first = _first_tensor(args)
        if first is not None and first.grad_fn is None and not self._is_output(first):
            self.fresh[key] += 1

    def on_output(self, module: Any, output: Any) -> None:
        """What an outermost training forward returned."""
        first = _first_tensor(output)
        if first is not None:
            try:
                entry = [weakref.ref(first), id(module), False]
            except TypeError:
                return
            self.outputs.append(entry)
            if id(module) in self.modules:
                self.produced[id(module)] += 1

    def _is_output(self, t: torch.Tensor) -> bool:
        ptr = _storage(t)
        if not ptr:
            return False
        for entry in self.outputs:
            out = entry[0]()
            if out is not None and _storage(out) == ptr:
                if not entry[2]:
                    entry[2] = True
                    self.read[entry[1]] += 1
                return True
        return False

    def on_optimizer(self, opt: Any) -> None:
        """An optimizer was built: its models are other models to every other optimizer's
        updates from then on, before it ever steps (gan_pytorch.py's G steps after 20 D updates)."""
        if len(self.built) < MAX_OPTIMIZERS:
            try:
                self.built.append(weakref.ref(opt))
            except TypeError:
                pass

    def _other_models(self, opt: Any, modules: list[int]) -> set[int]:
        """The seen modules other optimizers update and `opt` does not."""
        others: set[int] = set()
        for ref in self.built:
            other = ref()
            if other is not None and other is not opt:
                others.update(self.modules_of(other))
        return others.difference(modules)

    # ------------------------------------------------------------ an update
    def modules_of(self, opt: Any) -> list[int]:
        """Ids of the seen modules whose parameters the optimizer updates (recomputed when a
        module was first seen after the last look)."""
        known = self.updated.get(id(opt))
        if known is not None and known[0] == len(self.modules):
            return known[1]
        params = {id(p) for group in opt.param_groups for p in group["params"]}
        found: list[int] = []
        parts: dict[int, str] = {}  # one name per part: the root and its discriminator, both seen, are one
        for key, ref in self.modules.items():
            module = ref()
            if module is not None and any(id(p) in params for p in module.parameters()):
                found.append(key)
                part = updated_part(module, params)
                parts.setdefault(id(part), module_class(part))
        if len(self.updated) < MAX_OPTIMIZERS or id(opt) in self.updated:
            self.updated[id(opt)] = (len(self.modules), found)
            self.over[id(opt)] = list(parts.values())
        return found

    def on_update(self, opt: Any) -> int | None:
        """The optimizer stepped: its micro-batches since its own previous update (None past
        the bound on optimizers)."""
        key = id(opt)
        if key not in self.marks and len(self.marks) >= MAX_OPTIMIZERS:
            return None
        loader0, backwards0, fresh0, unread0 = self.marks.get(key, (0, 0, {}, {}))
        modules = self.modules_of(opt)
        backwards = self.backwards - backwards0
        unread = {m: self.produced[m] - self.read[m] for m in self.modules}
        if self.loader_batches > loader0:
            micro = self.loader_batches - loader0
        else:
            micro = max((self.fresh[m] - fresh0.get(m, 0) for m in modules), default=0)
            if micro > 0:  # less other models' outputs no module read (module docstring)
                others = self._other_models(opt, modules)
                micro = max(1, micro - sum(max(0, unread[m] - unread0.get(m, 0)) for m in others))
            else:
                micro = backwards
        if backwards > 0:
            # a micro-batch is a backward's: an episode's 100 forwards (one per environment
            # step) backwarded once are one update of one batch, not accumulation
            micro = min(micro, backwards)
        self.marks[key] = (self.loader_batches, self.backwards, {m: self.fresh[m] for m in modules}, unread)
        self.micro.setdefault(key, Counter())[micro] += 1
        return micro
