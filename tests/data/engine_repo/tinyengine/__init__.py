"""tinyengine: kvspec's gate fixture, a tiny paged KV block allocator with prefix caching."""
