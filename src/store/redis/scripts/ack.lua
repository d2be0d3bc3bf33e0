-- Acknowledge invalidations of one sender: record the acknowledging
-- instance in each invalidation's own set, then publish one
-- acknowledgement naming them all on the sender's channel. The sender
-- counts the published acknowledgements, and accepts them once each set
-- holds every member it waits for: a client that may only publish (and
-- read) cannot add a name to a set, so it cannot acknowledge in another
-- instance's name; one that copies a purge's nonce into a message of its
-- own gets an acknowledgement of what it named.
--
-- KEYS[i]   acks   set: the instances that acknowledged one invalidation
--                  (`{prefix}:acks:{<sender>}:<nonce>`: one sender's sets
--                  share a hash tag, so one cluster slot)
-- ARGV[1]   keep     the sets' lifetime in milliseconds (a few subscription
--                    leases: the sender reads each within one)
-- ARGV[2]   channel  the sender's acknowledgement channel
-- ARGV[3]   message  the acknowledgement, naming every invalidation
-- ARGV[3+i] acker    for KEYS[i]: the acknowledging instance and what the
--                    message it handled invalidated, `<instance>:<subject>`
--
-- Returns the instances that received the acknowledgement.
for i, key in ipairs(KEYS) do
  redis.call('SADD', key, ARGV[3 + i])
  redis.call('PEXPIRE', key, ARGV[1])
end
return redis.call('PUBLISH', ARGV[2], ARGV[3])
