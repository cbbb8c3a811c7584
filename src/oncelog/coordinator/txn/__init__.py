"""The transaction coordinator: producer ids, transactional ids, the transaction log."""
