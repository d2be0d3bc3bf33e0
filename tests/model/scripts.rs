//! The model is kept in step with the Lua scripts it models: each script's
//! BLAKE3 hash as the model was last checked against it. A script whose text
//! changes fails `scripts_match_the_model` until its model action (redis.rs,
//! lock_redis.rs, tags.rs, members.rs) is brought in line and the hash here
//! updated. Also run in the debug suite (tests/fleet/model_scripts.rs).

/// (script, BLAKE3 of its text, the model function that mirrors it).
pub const MODELLED: [(&str, &str, &str); 14] = [
    (
        "fence.lua",
        "52ca3ac30d2d5552a3ce88f24e1d344a37ff9c4792bb5c11c7322277ab813f27",
        "redis.rs: at_least, seed_fence, generation, current",
    ),
    (
        "fetch_or_lease.lua",
        "83845fe6ad71a28a52fa59679c0de2b2a626a2f888f00e87bd2ed33495c92675",
        "redis.rs: Redis::fetch_or_lease",
    ),
    (
        "commit.lua",
        "5509b3ee83255933da4e933520a683dea250d8dd0b375fe6ff6c77916274cd72",
        "redis.rs: Redis::commit",
    ),
    (
        "release.lua",
        "5647065f669797b309e3dde6457534fb2692d53994360d0acd88235abd9e20cd",
        "redis.rs: Redis::release",
    ),
    (
        "renew.lua",
        "26d9f651a2ae3ff69d2ee250294e7cf96fbb0aa71250759743cb5d5c3d9e337a",
        "redis.rs: Redis::renew",
    ),
    (
        "invalidate.lua",
        "6a9429e7b8dd2013dbb75918860a09745d833aafc8d1cb11e828216104039207",
        "redis.rs: Redis::invalidate",
    ),
    (
        "lock_acquire.lua",
        "5abd2fd72cb3ebf84b1f1ada8be635d2a4fd4d76fcb9aad264bece54fc4a15a4",
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
        "63e87c7bd5f631e8f0a99cbf0ef318a58a391c8e6e4645c122b9d306a62f85ad",
        "lock_redis.rs: LockRedis::leave",
    ),
    (
        "bump_generation.lua",
        "3bf36b463e66b334511220ad8f7927e9e22ad010fe4f0499bb9e0a919b2e2749",
        "tags.rs: TagRedis::bump",
    ),
    (
        "load_generations.lua",
        "0acb611dde4b330464e171afd4e9ae752a7b0339913c8f0d7ecbd25c954c3458",
        "tags.rs: TagRedis::load",
    ),
    (
        "member_renew.lua",
        "556ffe31a65b9955b8ee1649d6660ac1fa11304d58d2a654067b1183614cfde9",
        "members.rs: Set::renew",
    ),
    (
        "members.lua",
        "5121f0b104f0d53bc52a110a2f26ed771e00ffa82dc476fa63f393d94043064a",
        "members.rs: Set::read",
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
        "ack.lua",
        "8ba7f420700e15bf51e4afdf163718dc5160eb97f5202fec51cb514afad7c03f",
        "the model has no forger: an acknowledgement is the message of an instance \
         that handled the invalidation, and the barrier counts it as such; the \
         record this script adds is what lets the invalidator refuse forged ones \
         (tests/invalidation/acks.rs, tests/tags/barrier.rs on real Redis)",
    ),
    (
        "note_purge.lua",
        "b7f30d576905b6920965725c779dfc0c9e3b74965b45dbf38491d70c75fdedf3",
        "the purge mark a key purge moves: it is read only to tell a Redis restored \
         from a copy older than a purge, and the model has no restore from a copy \
         (tests/fleet/attacks_on_outages.rs on real Redis)",
    ),
];

/// Checks the scripts in `dir` against the lists above: every `.lua` file
/// is listed in exactly one of them, every listed one exists, and each
/// file's text has the recorded hash. Returns what is wrong.
fn check_scripts(dir: &std::path::Path) -> Result<(), String> {
    let mut present: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| format!("the scripts directory {}: {e}", dir.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".lua"))
        .collect();
    present.sort();
    let mut listed: Vec<String> = MODELLED
        .iter()
        .chain(NOT_MODELLED.iter())
        .map(|(n, _, _)| n.to_string())
        .collect();
    listed.sort();
    let mut twice = listed.clone();
    twice.dedup();
    if twice.len() != listed.len() {
        return Err(format!("a script is listed twice: {listed:?}"));
    }
    if present != listed {
        let unlisted: Vec<&String> = present.iter().filter(|n| !listed.contains(n)).collect();
        let missing: Vec<&String> = listed.iter().filter(|n| !present.contains(n)).collect();
        return Err(format!(
            "every Lua script must be modelled in tests/model or listed in NOT_MODELLED \
             (tests/model/scripts.rs): not listed {unlisted:?}, listed but absent {missing:?}"
        ));
    }
    let mut stale = vec![];
    for (name, recorded, mirror) in MODELLED.iter().chain(NOT_MODELLED.iter()) {
        let text = std::fs::read(dir.join(name)).map_err(|e| format!("{name}: {e}"))?;
        let hash = blake3::hash(&text).to_hex().to_string();
        if hash != *recorded {
            stale.push(format!(
                "  {name}: now {hash}, model checked against {recorded:?}; update {mirror}"
            ));
        }
    }
    if !stale.is_empty() {
        return Err(format!(
            "Lua scripts changed since the model was checked against them; bring the model in \
             line, then record the new hashes in tests/model/scripts.rs:\n{}",
            stale.join("\n")
        ));
    }
    Ok(())
}

fn scripts_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store/redis/scripts")
}

#[test]
fn scripts_match_the_model() {
    if let Err(e) = check_scripts(&scripts_dir()) {
        panic!("{e}");
    }
}

/// A copy of the scripts directory, in a fresh temporary directory.
fn copy_of_scripts(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("model-scripts-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temporary directory");
    for entry in std::fs::read_dir(scripts_dir()).expect("the scripts directory") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), dir.join(entry.file_name())).expect("copy");
    }
    dir
}

/// The check itself is checked: a script added without a model, one
/// removed, and one edited each fail it.
#[test]
fn the_script_check_refuses_unlisted_changed_and_missing_scripts() {
    let dir = copy_of_scripts("added");
    std::fs::write(dir.join("new_script.lua"), "return 1\n").expect("write");
    let err = check_scripts(&dir).expect_err("an unlisted script must fail the check");
    assert!(err.contains("new_script.lua"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);

    let dir = copy_of_scripts("removed");
    std::fs::remove_file(dir.join("renew.lua")).expect("remove");
    let err = check_scripts(&dir).expect_err("a missing script must fail the check");
    assert!(err.contains("renew.lua"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);

    for (name, _, mirror) in MODELLED.iter().chain(NOT_MODELLED.iter()) {
        let dir = copy_of_scripts("edited");
        let mut text = std::fs::read(dir.join(name)).expect("read");
        text.extend_from_slice(b"\n-- edited\n");
        std::fs::write(dir.join(name), text).expect("write");
        let err = check_scripts(&dir).expect_err("an edited script must fail the check");
        assert!(err.contains(name) && err.contains(mirror), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
