//! The model is kept in step with the Lua scripts it models: each script's
//! BLAKE3 hash as the model was last checked against it. A script whose text
//! changes fails `scripts_match_the_model` until its model action (redis.rs,
//! lock_redis.rs) is brought in line and the hash here updated.

/// (script, BLAKE3 of its text, the model function that mirrors it).
pub const MODELLED: [(&str, &str, &str); 10] = [
    (
        "fence.lua",
        "7e57f876169f53befc06f56787582be7ff56b9fd1b45b3e9ad8a68dadca3e235",
        "redis.rs: seed_fence, generation, current",
    ),
    (
        "fetch_or_lease.lua",
        "45176b03bc15f7d84563a2dbfa74a40abb6a7c5bcb180363487b23d29681e97a",
        "redis.rs: Redis::fetch_or_lease",
    ),
    (
        "commit.lua",
        "55da6baf2a9bcde2e471124992f60a11dedc4eabb98d82767b2d8a0237d77ad8",
        "redis.rs: Redis::commit",
    ),
    (
        "release.lua",
        "5aefbb4fbd9f56a42ccafc59d29e5b25129a49b24bb9adf4461f7ee1e4e236cf",
        "redis.rs: Redis::release",
    ),
    (
        "renew.lua",
        "26185325a383fb643ded3f4c8713c43965f42ddd94c4b2945881e84d0e956679",
        "redis.rs: Redis::renew",
    ),
    (
        "invalidate.lua",
        "e97e239fe6bcec3be0deeccac8f76f1b125411a7d67ea7414a51a81f487e45c0",
        "redis.rs: Redis::invalidate",
    ),
    (
        "lock_acquire.lua",
        "e0e85bbbfa5f5a2e1b557c14f3f43f8d9ea3cbd7bc58344164fa7eee6bbce448",
        "lock_redis.rs: LockRedis::acquire",
    ),
    (
        "lock_renew.lua",
        "144b850d3a6e16d366fce6f1d60fc9e073ddbe6259d315a045840e814220c38d",
        "lock_redis.rs: LockRedis::renew",
    ),
    (
        "lock_release.lua",
        "fb9de8844ac3e43eaa769723bc7a5d3c06a2da2433a08e4066a6733e3778abfd",
        "lock_redis.rs: LockRedis::release",
    ),
    (
        "lock_leave.lua",
        "783d4c3617ed9e6a516355573b65614fca6960ebca2386ed7f90fb51e7bdb75b",
        "lock_redis.rs: LockRedis::leave",
    ),
];

/// Scripts the model does not mirror yet, with why, and the BLAKE3 of the
/// text that reason was written for: a change to one fails the check too, so
/// the reason is read again.
pub const NOT_MODELLED: [(&str, &str, &str); 3] = [
    (
        "fetch_fresh.lua",
        "dc3876faf661127a5ddd9e1eb649a72dd51f37b9f94e4b9afeedc72658210dcf",
        "read-only: the fresh read a call falls back to while a Cluster slot moves; \
         it writes nothing, takes no lease and answers only a fresh entry",
    ),
    (
        "bump_generation.lua",
        "7d02de2da9e714cd1c8a362cb20d96fe090314a6ffb7ffd400705b3f913595c8",
        "the tag-generation table (invalidate_tag, invalidate_all): not modelled yet",
    ),
    (
        "load_generations.lua",
        "05b4245f86f3e26aa11b6d9c0961b783cad8fb6374e606a32489f366d42c6abe",
        "reads the tag-generation table: not modelled yet",
    ),
];

#[test]
fn scripts_match_the_model() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store/redis/scripts");
    let mut present: Vec<String> = std::fs::read_dir(&dir)
        .expect("the scripts directory")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".lua"))
        .collect();
    present.sort();
    let mut modelled: Vec<String> = MODELLED
        .iter()
        .chain(NOT_MODELLED.iter())
        .map(|(n, _, _)| n.to_string())
        .collect();
    modelled.sort();
    assert_eq!(
        present, modelled,
        "every Lua script must be modelled in tests/model (and listed in tests/model/scripts.rs)"
    );
    let mut stale = vec![];
    for (name, recorded, mirror) in MODELLED.iter().chain(NOT_MODELLED.iter()) {
        let text = std::fs::read(dir.join(name)).expect("script readable");
        let hash = blake3::hash(&text).to_hex().to_string();
        if hash != *recorded {
            stale.push(format!(
                "  {name}: now {hash}, model checked against {recorded:?}; update {mirror}"
            ));
        }
    }
    assert!(
        stale.is_empty(),
        "Lua scripts changed since the model was checked against them; bring the model in line, \
         then record the new hashes in tests/model/scripts.rs:\n{}",
        stale.join("\n")
    );
}
