"""The operator dashboard: a read-only web page served by Controlplane, and its per-pack metrics.

``overview`` reads what the page shows (``connectors`` and ``workers`` ask Connectors and the
Integration hosts over their RPCs), ``operations`` reads the operating panels (claim pauses and
order policies, dead letters, coverage) from Connectors over its RPCs through ``connectors``,
``app`` serves it as JSON endpoints and static files,
``server`` runs the app on its own port (``NEXUSCRM_DASHBOARD_ADDRESS``), and ``collector``
exports the per-pack gauges to Prometheus from the same reads.
"""
