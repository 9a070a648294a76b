from tieredkv.cache.index.page_key import KEY_BYTES, chain_keys, namespace_root_key, page_key


def test_keys_chain_through_parents() -> None:
    root = namespace_root_key(b"fp", "default")
    keys = chain_keys(root, list(range(40)), page_size=16)
    assert len(keys) == 2  # the 8 trailing tokens make no full page
    assert keys[0] == page_key(root, range(16))
    assert keys[1] == page_key(keys[0], range(16, 32))
    assert all(len(key) == KEY_BYTES for key in keys)


def test_namespaces_and_fingerprints_never_share_keys() -> None:
    tokens = list(range(16))
    roots = {
        namespace_root_key(b"fp", "a"),
        namespace_root_key(b"fp", "b"),
        namespace_root_key(b"fp2", "a"),
        namespace_root_key(b"f", "pa"),  # length-prefixed: no ambiguity in concatenation
    }
    assert len(roots) == 4
    assert len({page_key(root, tokens) for root in roots}) == 4


def test_same_tokens_other_parent_differ() -> None:
    root = namespace_root_key(b"fp", "default")
    assert page_key(root, [1] * 16) != page_key(page_key(root, [1] * 16), [1] * 16)
