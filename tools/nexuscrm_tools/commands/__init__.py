"""The ``nexuscrm`` subcommands: one module per command group, its handlers beside the ``add_commands`` of their flags.

``shared`` is what every group uses (the ``Outcome`` a handler answers, the leaf parser, the paging and
identity flags) and ``generations`` how a generation reads; ``nexuscrm_tools.cli`` assembles the parser
from the groups, in the order ``--help`` lists them, and runs one handler.
"""
