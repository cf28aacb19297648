"""slotscope's domain: the scenario, the engine as modelled, its memory and scheduling, the designs under
test, the oracle, and the step pipeline that runs them. It imports none of the other packages; they plug
in through the protocols defined here (docs/ARCHITECTURE.md maps every module).

Subpackages, from the bottom up (each imports only those before it):

* ``scenario``: TOML in, a validated frozen ``Scenario`` out; model presets; graph capture sizes.
* ``engine_model``: the engine as slotscope models it: backend specs, release behaviour, padding
  conventions, the sharing and unified pool bug switches.
* ``memory``: slots and pools: the allocators, the pool-writer protocol, slot events.
* ``scheduling``: which slots each forward writes: the scheduler, batches, the prefix cache, the PD
  decode node, the overlap timeline's journal.
* ``designs``: the write-location logic under test and its hook interface; the built-in catalogue.
* ``oracle``: who should own each slot (the reference pool), the tag codec, the checker.
* ``core``: one step of a run: the backend boundary, the executors, the read check, the model sides.
* ``plugins``: what sits around a step: the overlap timeline, the unified pool's plan, fault injection.

``simulator.run`` assembles a run from a scenario and drives its steps.
"""
