"""Authentication and authorization with Kafka's semantics: ACLs, the authorizer and where ACLs are kept."""
