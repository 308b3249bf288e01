"""Run identity and the durable records around a run: reservations, receipts, journals, source."""
