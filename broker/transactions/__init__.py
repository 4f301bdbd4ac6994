"""Transactions (issue #28): the coordinator's state machine and its ``__transaction_state``
record format. Built in steps: this package holds the pure parts first
(``log_records``, ``state``); the coordinator that drives them comes next
(``docs/transactions.md``)."""
