//! The Lua scripts the tier runs, each one atomic step of the protocol
//! (their own comments say what each does), loaded on every new primary.

use redis::Script;

/// Every script, made once per tier.
pub(super) struct Scripts {
    pub(super) fetch_or_lease: Script,
    pub(super) fetch_fresh: Script,
    pub(super) commit: Script,
    pub(super) release: Script,
    pub(super) renew: Script,
    pub(super) invalidate: Script,
    pub(super) lock_acquire: Script,
    pub(super) lock_release: Script,
    pub(super) lock_renew: Script,
    pub(super) lock_leave: Script,
    pub(super) bump_generation: Script,
    pub(super) load_generations: Script,
    pub(super) note_purge: Script,
    pub(super) member_renew: Script,
    pub(super) members: Script,
    pub(super) ack: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Scripts {
            fetch_or_lease: Script::new(concat!(
                include_str!("scripts/fence.lua"),
                include_str!("scripts/fetch_or_lease.lua")
            )),
            fetch_fresh: Script::new(concat!(
                include_str!("scripts/fence.lua"),
                include_str!("scripts/fetch_fresh.lua")
            )),
            commit: Script::new(concat!(
                include_str!("scripts/fence.lua"),
                include_str!("scripts/commit.lua")
            )),
            release: Script::new(include_str!("scripts/release.lua")),
            renew: Script::new(include_str!("scripts/renew.lua")),
            invalidate: Script::new(concat!(
                include_str!("scripts/fence.lua"),
                include_str!("scripts/invalidate.lua")
            )),
            lock_acquire: Script::new(include_str!("scripts/lock_acquire.lua")),
            lock_release: Script::new(include_str!("scripts/lock_release.lua")),
            lock_renew: Script::new(include_str!("scripts/lock_renew.lua")),
            lock_leave: Script::new(include_str!("scripts/lock_leave.lua")),
            bump_generation: Script::new(include_str!("scripts/bump_generation.lua")),
            load_generations: Script::new(include_str!("scripts/load_generations.lua")),
            note_purge: Script::new(include_str!("scripts/note_purge.lua")),
            member_renew: Script::new(include_str!("scripts/member_renew.lua")),
            members: Script::new(include_str!("scripts/members.lua")),
            ack: Script::new(include_str!("scripts/ack.lua")),
        }
    }

    pub(super) fn all(&self) -> [&Script; 16] {
        [
            &self.fetch_or_lease,
            &self.fetch_fresh,
            &self.commit,
            &self.release,
            &self.renew,
            &self.invalidate,
            &self.lock_acquire,
            &self.lock_release,
            &self.lock_renew,
            &self.lock_leave,
            &self.bump_generation,
            &self.load_generations,
            &self.note_purge,
            &self.member_renew,
            &self.members,
            &self.ack,
        ]
    }
}
