"""Core schema catalog: the canonical tables and their migrations (docs/design.md).

Code map: each RPC (``servicer``) -> the function doing its work, which runs its own SQL:

- ApplySchema: ``migrations.apply_schema``
- DescribeSchema, VerifySchema: ``nexuscrm_schema.verification`` (``describe_schema``, ``verify_schema``)
- ContractPayloads: ``payload_contract.contract_payloads`` (moves: ``payload_move``; counts:
  ``payload_contract.count_moves``)
"""
