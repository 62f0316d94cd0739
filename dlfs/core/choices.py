"""The values of the command line's choice flags, named once where the parser can read them without
loading what implements them (numpy, the pack): ``order.MODES`` implements the ``ORDER_MODES`` and
``pack.placement`` lays out the ``PLACEMENTS`` (a test checks that the modes agree)."""

from __future__ import annotations

#: Epoch orders by name (``dlfs mount --order``): a uniform shuffle, or block-wise runs of storage
#: neighbours for slow media (``dlfs.core.order``).
ORDER_MODES = ("full", "block")

#: Where file bytes go in the shards (``dlfs pack --placement``): in sorted tree order, or in a
#: seeded random order (``dlfs.pack.placement``).
PLACEMENTS = ("tree", "random")

#: Other spellings a choice flag accepts, and the value each means; ``--help`` lists only the values.
PLACEMENT_ALIASES = {"source": "tree"}
