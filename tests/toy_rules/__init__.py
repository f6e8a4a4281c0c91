"""A made-up framework, ``toyfw``, with one rule of its own: the proof that a framework is a folder
of rules plus one registry entry (see ``test_registry.py``). Not installed; tests put it on the path.
"""

from dpmigrate.codemod.vocabulary import Vocabulary
from dpmigrate.rules.common import InitRuntime, MainProcessPrint, RankDivergence

from .toy_save import ToySave

VOCABULARY = Vocabulary(
    framework="toyfw",
    display_name="ToyFW",
    runtime_module="dpmigrate.runtime.toyfw",
    default_generation="toy1",
    generations=(("toyfw.legacy", "toy0"),),
    distributed_prefixes=("toyfw.cluster",),
    distributed_description="toyfw.cluster",
    backward_methods=("learn",),
    optimizer_step_methods=("advance",),
    save_calls=frozenset({"toyfw.save"}),
    rank_calls=frozenset({"toyfw.cluster.whoami"}),
    collectives=frozenset({"toyfw.cluster.sync"}),
)

RULES = (InitRuntime, ToySave, MainProcessPrint, RankDivergence)
