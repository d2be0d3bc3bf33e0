-- Acknowledge an invalidation: record the acknowledging instance in the
-- invalidation's own set, then publish the acknowledgement on its sender's
-- channel. The sender counts the published acknowledgements, and accepts
-- them once the set holds every member it waits for: a client that may
-- only publish (and read) cannot add a name to the set, so it cannot
-- acknowledge in another instance's name; one that copies a purge's nonce
-- into a message of its own gets an acknowledgement of what it named.
--
-- KEYS[1] acks     set: the instances that acknowledged this invalidation
--                  (`{prefix}:acks:<sender>:<nonce>`)
-- ARGV[1] acker    the acknowledging instance and what the message it
--                  handled invalidated, `<instance>:<subject>`
-- ARGV[2] keep     the set's lifetime in milliseconds (a few subscription
--                  leases: the sender reads it within one)
-- ARGV[3] channel  the sender's acknowledgement channel
-- ARGV[4] message  the acknowledgement
--
-- Returns the instances that received the acknowledgement.
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return redis.call('PUBLISH', ARGV[3], ARGV[4])
