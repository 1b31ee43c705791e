//! The Lua script the cluster client runs, and its reply.
//!
//! It takes the time from Redis (`TIME`, so every instance shares one clock), renews this instance's membership of the
//! rule, drops members whose membership expired, applies the tokens the instance gives back (a lease that ended with
//! tokens left, per bucket) and counts the calls its local fallback admitted (per bucket, so that the window does not
//! grant them again). A call carries a deadline in Redis time (the instant its caller gives up waiting, estimated from
//! an earlier reply so that it is never late): run after it (Redis hung with the call queued), it grants nothing, so no
//! token goes to a caller that left, and it counts no admissions (its caller counts the call failed and sends them
//! again). A call that ran in time but whose reply its caller never saw (it came after the timeout, or the connection
//! lost it) is undone by the member's next call that runs: calls are numbered, the window hash records what the
//! member's last call counted (field `c:<member>`: its number, when it ran, its grant and the admissions it counted),
//! and each call names the first of its member's calls whose reply was not seen, so the window counts exactly what the
//! client knows it was granted and reported. (A member keeps one such record per lease it holds on the window: rules of
//! one instance that share a `flowId` number their calls and batches apart, each in a record of its own.) Tokens given back come in numbered batches, sent again with every call
//! until a reply shows them applied; the window hash records the last batch applied per member (field `s:<member>`,
//! with the Redis time it was applied, dropped a window later), so a batch whose first call ran but whose reply was
//! lost is not applied twice: a give-back that fails while Redis is down is applied, once, when it answers again. The
//! window hash holds its generation (field `g`, the Redis time it was made): a window made afresh (its key was lost: a
//! restart, `FLUSHALL`, a failover) grants nothing to a caller that knew another one until it has counted its own
//! unspent grants in it. It then sums the buckets of the sliding window (dropping expired ones), grants at most what is
//! left under the limit (`count` per window for global thresholds, `count × live instances` for average-local ones) in
//! the current bucket, tells when the window frees room again if it is used up, and what each of the window's buckets
//! holds (what a fallback that starts before the next reply owes, bucket by bucket, until they leave the window). It
//! runs through EVALSHA, loaded again on `NOSCRIPT` (the client's script helper).

use redis::{FromRedisValue, RedisError, Value};

use super::keys::RuleKeys;

/// Renews the membership, gives tokens back, leases.
const LEASE: &str = r#"
-- A whole number from 0 to 2^53 read from the window, or nil: a value someone else wrote there (text, a
-- fraction, a negative, NaN, an infinity) counts as nothing, so that no value read can stop the script
-- half-way (after some of its writes) or open the window, and the sweep below drops it.
local function count(x)
  local v = tonumber(x)
  if v == nil or v ~= v or v < 0 or v > 9007199254740992 or v ~= math.floor(v) then
    return nil
  end
  return v
end
-- Adds `c` to bucket `b`'s count (read as a count: HINCRBY would stop on a value that is not an integer).
local function add(b, c)
  local v = count(redis.call('HGET', KEYS[1], tostring(b))) or 0
  -- At most 2^53: a sum past it would read as nothing (dropped, with what was added to it).
  redis.call('HSET', KEYS[1], tostring(b), string.format('%.0f', math.min(math.max(v + c, 0), 9007199254740992)))
end
-- Every argument read as a number is a finite one, the window has buckets of some length, and there are as
-- many arguments as the counts say: refuse before any write (a missing one stopped the script half-way,
-- after its undo writes; an infinite allowance or an empty bucket length granted all that was asked).
local function finite(x)
  local v = tonumber(x)
  return v ~= nil and v == v and v ~= math.huge and v ~= -math.huge
end
local function malformed()
  for _, i in ipairs({1, 3, 4, 6, 7, 8, 9, 10, 11, 12}) do
    if not finite(ARGV[i]) then return true end
  end
  if tonumber(ARGV[6]) < 1 or tonumber(ARGV[7]) < 1 then return true end
  local nr = tonumber(ARGV[12])
  if ARGV[2] == nil or nr < 0 or nr ~= math.floor(nr) then return true end
  local na = tonumber(ARGV[13 + 3 * nr])
  if na == nil or na < 0 or na ~= math.floor(na) or #ARGV ~= 14 + 3 * nr + 2 * na then return true end
  for i = 13, #ARGV do
    if not finite(ARGV[i]) then return true end
  end
  local rec = tonumber(ARGV[#ARGV])
  if rec < 0 or rec ~= math.floor(rec) then return true end
  return false
end
if malformed() then
  return redis.error_reply('ERR the lease script was called with malformed arguments')
end
-- Another type at either key would stop the script at its first write there: refuse before any write.
for i, kind in ipairs({'hash', 'zset'}) do
  local found = redis.call('TYPE', KEYS[i])['ok']
  if found ~= 'none' and found ~= kind then
    return redis.error_reply('WRONGTYPE the key ' .. KEYS[i] .. ' holds a ' .. found .. ', not a ' .. kind)
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local want = tonumber(ARGV[1])
local deadline = tonumber(ARGV[8])
local late = 0
if deadline > 0 and now >= deadline then
  late = 1
  want = 0
end
local gen = count(redis.call('HGET', KEYS[1], 'g')) or 0
if gen == 0 then
  gen = tonumber(t[1]) * 1000000 + tonumber(t[2])
  redis.call('HSET', KEYS[1], 'g', string.format('%.0f', gen))
end
local known = tonumber(ARGV[9])
if known ~= 0 and known ~= gen then
  want = 0
end
local ttl = tonumber(ARGV[3])
local blen = tonumber(ARGV[6])
local n = tonumber(ARGV[7])
local cur = math.floor(now / blen)
local oldest = cur - n + 1
if ttl > 0 then
  redis.call('ZADD', KEYS[2], now + ttl, ARGV[2])
else
  redis.call('ZREM', KEYS[2], ARGV[2])
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('PEXPIRE', KEYS[2], math.max(ttl, 1) * 2)
local live = redis.call('ZCARD', KEYS[2])
-- What this member's last call counted (field `c:<member>`: its number, the Redis time it ran, then
-- (bucket, tokens) pairs). Calls numbered from ARGV[11] up to this one (ARGV[10]) got no reply their
-- caller saw: it gave up on them, was granted none of their tokens and sends their admissions again, so
-- what the one among them that ran last counted is taken out of the window (each call takes out the one
-- before it). A call older than the one recorded ran after it, hence after its caller gave up on it: it
-- is late, whatever its deadline says (a first call carries none), and changes no record.
local seq = tonumber(ARGV[10])
local from = tonumber(ARGV[11])
-- The member's records (`c:` and `s:`) are per lease of the instance on this window (the last argument, 0 for
-- the first: several rules of one instance may share a window, one flowId): each numbers its own calls and
-- batches, so sharing one record, one's numbers would read as late or applied for the other.
local owner = ARGV[2]
if tonumber(ARGV[#ARGV]) > 0 then
  owner = owner .. '#' .. string.format('%.0f', tonumber(ARGV[#ARGV]))
end
local ckey = 'c:' .. owner
local record = true
local cv = redis.call('HGET', KEYS[1], ckey)
if cv then
  local nums = {}
  for x in string.gmatch(cv, '%d+') do nums[#nums + 1] = count(x) or 0 end
  local q = nums[1] or 0
  if q >= seq then
    record = false
    late = 1
    want = 0
  elseif q >= from then
    for i = 3, #nums - 1, 2 do
      local b = nums[i]
      if b >= oldest and b <= cur then
        local v = count(redis.call('HGET', KEYS[1], tostring(b))) or 0
        local back = math.min(v, nums[i + 1])
        if back > 0 then
          add(b, -back)
        end
      end
    end
  end
end
local counted = {}
local nr = tonumber(ARGV[12])
local na = tonumber(ARGV[13 + 3 * nr])
if late == 1 then
  -- Its caller gave up on it and counts it failed: it sends the admissions again.
  na = 0
end
-- Tokens given back come in numbered batches, sent again until a reply shows them applied: a batch
-- numbered at most what this member's field records was applied already (by a call whose reply was lost).
local skey = 's:' .. owner
local applied = 0
local sv = redis.call('HGET', KEYS[1], skey)
if sv then
  applied = count(string.match(sv, '^(%d+)')) or 0
end
local top = applied
for i = 0, nr - 1 do
  local q = tonumber(ARGV[13 + 3 * i])
  local b = tonumber(ARGV[14 + 3 * i])
  local c = tonumber(ARGV[15 + 3 * i])
  -- Only to the window the tokens were granted in (one made afresh never counted them).
  if q > applied and known == gen and b >= oldest and b <= cur then
    local v = count(redis.call('HGET', KEYS[1], tostring(b))) or 0
    local back = math.min(v, c)
    if back > 0 then
      add(b, -back)
    end
  end
  if q > top then top = q end
end
if ttl == 0 then
  redis.call('HDEL', KEYS[1], skey)
elseif top > applied then
  redis.call('HSET', KEYS[1], skey, string.format('%.0f:%.0f', top, now))
end
local at = 13 + 3 * nr
for i = 0, na - 1 do
  local b = tonumber(ARGV[at + 1 + 2 * i])
  local c = tonumber(ARGV[at + 2 + 2 * i])
  if b > cur then b = cur end
  if b >= oldest and c > 0 then
    add(b, c)
    counted[#counted + 1] = string.format('%.0f:%.0f', b, c)
  end
end
local fields = redis.call('HGETALL', KEYS[1])
local used = 0
local buckets = {}
for i = 1, #fields, 2 do
  local b = count(fields[i])
  local v = count(fields[i + 1])
  if fields[i] == 'g' then
    b = cur + 1
  elseif string.sub(fields[i], 1, 2) == 's:' then
    -- A member's last applied batch: kept a window after it was applied (a batch sent again later holds
    -- only buckets that left the window).
    local when = count(string.match(fields[i + 1], ':(%d+)$')) or 0
    if when + blen * n < now then
      redis.call('HDEL', KEYS[1], fields[i])
    end
  elseif string.sub(fields[i], 1, 2) == 'c:' then
    -- A member's last call: kept a window after it ran (by then what it counted left the window).
    local when = count(string.match(fields[i + 1], '^%d+:(%d+)')) or 0
    if when + blen * n < now then
      redis.call('HDEL', KEYS[1], fields[i])
    end
  elseif b == nil or v == nil or b < oldest or fields[i] ~= tostring(b) then
    -- Not a count, an old bucket, or a name that only reads as a bucket (`123.0`, ` 123`: the script
    -- writes and reads a bucket's count under `tostring(b)` alone).
    redis.call('HDEL', KEYS[1], fields[i])
  elseif b <= cur then
    used = used + v
    buckets[#buckets + 1] = {b, v}
  end
end
local limit = tonumber(ARGV[4])
if ARGV[5] ~= '1' then
  limit = limit * math.max(live, 1)
end
limit = math.floor(limit + 1e-9)
local avail = limit - used
if avail < 0 then avail = 0 end
local grant = want
if grant > avail then grant = avail end
if grant > 0 then
  add(cur, grant)
  buckets[#buckets + 1] = {cur, grant}
  counted[#counted + 1] = string.format('%.0f:%.0f', cur, grant)
end
if record then
  if ttl > 0 then
    redis.call('HSET', KEYS[1], ckey, string.format('%.0f:%.0f:', seq, now) .. table.concat(counted, ':'))
  else
    redis.call('HDEL', KEYS[1], ckey)
  end
end
redis.call('PEXPIRE', KEYS[1], blen * n * 2)
local retry = 0
if want > 0 and avail - grant <= 0 then
  table.sort(buckets, function(x, y) return x[1] < y[1] end)
  local need = used + grant - limit + 1
  local freed = 0
  retry = (cur + n) * blen
  for _, e in ipairs(buckets) do
    freed = freed + e[2]
    if freed >= need then
      retry = (e[1] + n) * blen
      break
    end
  end
end
local out = {grant, now, cur, live, avail - grant, retry, late, gen}
for _, e in ipairs(buckets) do
  out[#out + 1] = e[1]
  out[#out + 1] = e[2]
end
return out
"#;

/// The compiled lease script (its SHA is computed once).
pub(crate) struct Scripts {
    lease: redis::Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Scripts { lease: redis::Script::new(LEASE) }
    }
}

/// What one script call asks.
#[derive(Clone, Debug)]
pub(crate) struct LeaseCall {
    /// Tokens wanted (0: only renew the membership and give tokens back).
    pub(crate) want: u64,
    /// This instance's member name.
    pub(crate) member: String,
    /// Membership lifetime, ms (0: leave).
    pub(crate) ttl_ms: u64,
    /// The allowance per window: `count × window_interval / 1 s` (per instance for average-local).
    pub(crate) allowance: f64,
    /// Global threshold (else average-local).
    pub(crate) global: bool,
    /// Bucket length, ms.
    pub(crate) bucket_ms: u64,
    /// Buckets per window.
    pub(crate) sample_count: u32,
    /// The Redis time (ms) from which the call grants nothing (its caller gave up on it by then); 0: none.
    pub(crate) deadline_ms: i64,
    /// The window's generation the caller knows (0: none yet): a window made afresh since (its key was lost)
    /// grants nothing to a caller that has not counted its own tokens in it yet.
    pub(crate) generation: i64,
    /// This call's number (per member, ascending: the first numbered from Redis's clock, so that an instance
    /// that restarts under the same name numbers its calls above those of its previous life).
    pub(crate) seq: u64,
    /// Which of the member's records in the window the call keeps (its last call, its last batch applied): 0
    /// for the instance's first lease on the window, another number for each other rule of the instance that
    /// shares the window (one flowId), since each numbers its own calls and batches.
    pub(crate) record: u64,
    /// The number of the first of this member's calls whose reply it has not seen (this call's own when it
    /// saw every earlier one): what the last of those that ran counted is taken out of the window.
    pub(crate) unseen_from: u64,
    /// Tokens given back, in numbered batches (sent again until a reply shows them applied; each applied
    /// once): (batch number, bucket index, count), batch numbers ascending.
    pub(crate) returns: Vec<(u64, i64, u64)>,
    /// Calls admitted without a token (the local fallback), counted in the window: (bucket index, count).
    pub(crate) admitted: Vec<(i64, u64)>,
}

/// The script's reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LeaseReply {
    /// Tokens granted, in bucket `bucket`.
    pub(crate) granted: u64,
    /// Redis time of the call (ms since the epoch).
    pub(crate) redis_ms: i64,
    /// The bucket the tokens belong to.
    pub(crate) bucket: i64,
    /// Live instances of the rule (this one included, unless it left).
    pub(crate) live: u64,
    /// Tokens still free in the window after this grant.
    pub(crate) left: u64,
    /// When the window is used up: the Redis time it frees room for one call (0 otherwise).
    pub(crate) retry_at_ms: i64,
    /// The call ran past its deadline (Redis was slower than the caller's timeout): it granted nothing.
    pub(crate) late: bool,
    /// The window's generation (set when its key is made: a different one means the key was lost).
    pub(crate) generation: i64,
    /// What each bucket of the window holds after this call (bucket index, tokens), oldest first, one entry
    /// per bucket.
    pub(crate) window: Vec<(i64, u64)>,
}

impl FromRedisValue for LeaseReply {
    fn from_redis_value(v: Value) -> Result<Self, redis::ParsingError> {
        let items: Vec<i64> = FromRedisValue::from_redis_value(v)?;
        match items[..] {
            [granted, redis_ms, bucket, live, left, retry_at_ms, late, generation, ref rest @ ..]
                if rest.len() % 2 == 0 =>
            {
                // Sorted, then each bucket's entries summed (in time linear in the reply's length, up to the
                // sort: a reply is Redis's to make).
                let mut pairs: Vec<(i64, u64)> = rest.chunks_exact(2).map(|p| (p[0], p[1].max(0) as u64)).collect();
                pairs.sort_unstable_by_key(|&(b, _)| b);
                let mut window: Vec<(i64, u64)> = Vec::with_capacity(pairs.len());
                for (b, n) in pairs {
                    match window.last_mut() {
                        Some((x, c)) if *x == b => *c = c.saturating_add(n),
                        _ => window.push((b, n)),
                    }
                }
                Ok(LeaseReply {
                    granted: granted.max(0) as u64,
                    redis_ms,
                    bucket,
                    live: live.max(0) as u64,
                    left: left.max(0) as u64,
                    retry_at_ms,
                    late: late != 0,
                    generation,
                    window,
                })
            }
            _ => {
                Err(format!("the lease script returned {} values, expected 8 and (bucket, tokens) pairs", items.len())
                    .into())
            }
        }
    }
}

impl Scripts {
    /// Loads the lease script into Redis's script cache (so that the first lease call is one round trip).
    pub(crate) async fn load(&self, conn: &mut impl redis::aio::ConnectionLike) -> Result<(), RedisError> {
        self.lease.load_async(conn).await.map(|_| ())
    }

    /// Runs the lease script for `keys` (EVALSHA, loading it on NOSCRIPT).
    pub(crate) async fn lease(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
        keys: &RuleKeys,
        call: &LeaseCall,
    ) -> Result<LeaseReply, RedisError> {
        let mut inv = self.lease.key(&keys.window);
        inv.key(&keys.members)
            .arg(call.want)
            .arg(&call.member)
            .arg(call.ttl_ms)
            .arg(format!("{}", call.allowance))
            .arg(if call.global { "1" } else { "0" })
            .arg(call.bucket_ms)
            .arg(call.sample_count)
            .arg(call.deadline_ms)
            .arg(call.generation)
            .arg(call.seq)
            .arg(call.unseen_from)
            .arg(call.returns.len());
        for (q, b, n) in &call.returns {
            inv.arg(*q).arg(*b).arg(*n);
        }
        inv.arg(call.admitted.len());
        for (b, n) in &call.admitted {
            inv.arg(*b).arg(*n);
        }
        inv.arg(call.record);
        inv.invoke_async(conn).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply_of(items: &[i64]) -> Result<LeaseReply, redis::ParsingError> {
        LeaseReply::from_redis_value(Value::Array(items.iter().map(|n| Value::Int(*n)).collect()))
    }

    #[test]
    fn a_reply_lists_each_bucket_of_the_window_once_oldest_first() {
        // The bucket just granted in comes twice (what it held, and the grant): one entry, summed.
        let r = reply_of(&[5, 1_050, 10, 3, 95, 0, 0, 7, 8, 20, 10, 60, 10, 5, 9, 0]).unwrap();
        assert_eq!((r.granted, r.bucket, r.left, r.generation), (5, 10, 95, 7));
        assert_eq!(r.window, vec![(8, 20), (9, 0), (10, 65)]);
    }

    /// The lease script on a real `redis-server`: each call run once, its reply kept or dropped by the test
    /// (a reply its caller never saw).
    struct OnRedis {
        _redis: sentinel_testkit::redis::RedisServer,
        rt: tokio::runtime::Runtime,
        conn: redis::aio::MultiplexedConnection,
        keys: RuleKeys,
        scripts: Scripts,
        /// The window's generation and bucket at the first call (numbered `first`, seen).
        generation: i64,
        bucket: i64,
    }

    impl OnRedis {
        fn start(test: &str, first: u64) -> Option<OnRedis> {
            let redis = sentinel_testkit::redis::RedisServer::start(test)?;
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let client = redis::Client::open(redis.url()).unwrap();
            let conn = rt.block_on(client.get_multiplexed_async_connection()).unwrap();
            let keys = super::super::keys::keys("ns", "res:api");
            let mut r = OnRedis { _redis: redis, rt, conn, keys, scripts: Scripts::new(), generation: 0, bucket: 0 };
            let reply = r.run(&r.call(first, first, 0, &[]));
            (r.generation, r.bucket) = (reply.generation, reply.bucket);
            Some(r)
        }

        /// Call `seq` of member `me` (the first unseen one `from`), wanting `want` tokens and counting
        /// `admitted`: a global 1000 per two hours, in buckets of an hour (a test that crosses the hour still
        /// finds every bucket it used in the window), in the window the first call saw.
        fn call(&self, seq: u64, from: u64, want: u64, admitted: &[(i64, u64)]) -> LeaseCall {
            LeaseCall {
                want,
                member: "me".into(),
                ttl_ms: 60_000,
                allowance: 1000.0,
                global: true,
                bucket_ms: 3_600_000,
                sample_count: 2,
                deadline_ms: 0,
                generation: self.generation,
                seq,
                unseen_from: from,
                record: 0,
                returns: Vec::new(),
                admitted: admitted.to_vec(),
            }
        }

        fn run(&mut self, call: &LeaseCall) -> LeaseReply {
            let OnRedis { rt, conn, keys, scripts, .. } = self;
            rt.block_on(scripts.lease(conn, keys, call)).unwrap()
        }

        /// The tokens the window counts (its buckets' sum).
        fn total(&mut self) -> u64 {
            let OnRedis { rt, conn, keys, .. } = self;
            let fields: Vec<(String, String)> =
                rt.block_on(redis::cmd("HGETALL").arg(&keys.window).query_async(conn)).unwrap();
            fields.iter().filter(|(k, _)| k.parse::<i64>().is_ok()).map(|(_, v)| v.parse::<u64>().unwrap()).sum()
        }

        /// The member's record of its last call, if any.
        fn record(&mut self) -> Option<String> {
            let OnRedis { rt, conn, keys, .. } = self;
            rt.block_on(redis::cmd("HGET").arg(&keys.window).arg("c:me").query_async(conn)).unwrap()
        }
    }

    #[test]
    fn what_a_call_whose_reply_was_not_seen_counted_is_undone_by_the_next_call() {
        let Some(mut r) = OnRedis::start("what_a_call_whose_reply_was_not_seen_counted_is_undone", 100) else { return };
        let b = r.bucket;
        // Seen: 30 granted.
        assert_eq!(r.run(&r.call(101, 101, 30, &[])).granted, 30);
        // Run, its reply never seen: 20 granted and 5 of the fallback's admissions counted.
        assert_eq!(r.run(&r.call(102, 102, 20, &[(b, 5)])).granted, 20);
        assert_eq!(r.total(), 55);
        // The next call names 102 as the first unseen: what it counted goes; the admissions come again.
        let next = r.run(&r.call(103, 102, 0, &[(b, 5)]));
        assert!(!next.late);
        assert_eq!(r.total(), 35, "the 30 seen and the 5 admissions, once");
        // Seen (the first unseen is the call itself): nothing undone.
        assert_eq!(r.run(&r.call(104, 104, 10, &[])).granted, 10);
        assert_eq!(r.total(), 45);
    }

    #[test]
    fn calls_lost_in_a_row_are_undone_each_by_the_next_that_ran() {
        let Some(mut r) = OnRedis::start("calls_lost_in_a_row_are_undone", 10) else { return };
        let b = r.bucket;
        // Three calls whose replies were lost, each carrying the admissions again (more each time).
        r.run(&r.call(11, 11, 40, &[(b, 3)]));
        r.run(&r.call(12, 11, 40, &[(b, 3), (b + 1, 2)]));
        r.run(&r.call(13, 11, 40, &[(b, 3), (b + 1, 4)]));
        assert_eq!(r.total(), 40 + 7, "the last one's grant and admissions only");
        let seen = r.run(&r.call(14, 11, 25, &[(b, 3), (b + 1, 4)]));
        assert_eq!(seen.granted, 25);
        assert_eq!(r.total(), 25 + 7);
        // Leaving undoes nothing seen and drops the record.
        r.run(&LeaseCall { ttl_ms: 0, ..r.call(15, 15, 0, &[]) });
        assert_eq!(r.total(), 25 + 7);
        assert_eq!(r.record(), None);
    }

    #[test]
    fn a_call_that_runs_after_a_later_one_of_its_member_is_late_and_counts_nothing() {
        let Some(mut r) = OnRedis::start("a_call_that_runs_after_a_later_one", 50) else { return };
        let b = r.bucket;
        r.run(&r.call(52, 51, 10, &[]));
        let record = r.record();
        // Call 51 was sent first but reached Redis later (another connection; a first call has no deadline):
        // its caller gave up on it before sending 52.
        let old = r.run(&r.call(51, 51, 30, &[(b, 6)]));
        assert!(old.late && old.granted == 0, "{old:?}");
        assert_eq!(r.total(), 10);
        assert_eq!(r.record(), record, "the later call's record stays, for the call after it to undo");
        r.run(&r.call(53, 52, 0, &[(b, 6)]));
        assert_eq!(r.total(), 6);
    }

    impl OnRedis {
        /// Writes `value` into field `field` of the window's hash (what another writer of this Redis left).
        fn write(&mut self, field: &str, value: &str) {
            let OnRedis { rt, conn, keys, .. } = self;
            let _: () =
                rt.block_on(redis::cmd("HSET").arg(&keys.window).arg(field).arg(value).query_async(conn)).unwrap();
        }

        fn try_run(&mut self, call: &LeaseCall) -> Result<LeaseReply, RedisError> {
            let OnRedis { rt, conn, keys, scripts, .. } = self;
            rt.block_on(scripts.lease(conn, keys, call))
        }

        /// Deletes the rule's keys (a call then finds a window never made).
        fn clear(&mut self) {
            let OnRedis { rt, conn, keys, .. } = self;
            let _: () = rt.block_on(redis::cmd("DEL").arg(&keys.window).arg(&keys.members).query_async(conn)).unwrap();
        }

        /// Runs the script with `args` as written, as another caller could.
        fn eval(&mut self, args: &[&str]) -> Result<redis::Value, RedisError> {
            let OnRedis { rt, conn, keys, .. } = self;
            rt.block_on(
                redis::cmd("EVAL").arg(LEASE).arg(2).arg(&keys.window).arg(&keys.members).arg(args).query_async(conn),
            )
        }

        /// How many of the rule's keys exist.
        fn keys_existing(&mut self) -> i64 {
            let OnRedis { rt, conn, keys, .. } = self;
            rt.block_on(redis::cmd("EXISTS").arg(&keys.window).arg(&keys.members).query_async(conn)).unwrap()
        }

        /// Every field of the window's hash.
        fn fields(&mut self) -> Vec<(String, String)> {
            let OnRedis { rt, conn, keys, .. } = self;
            let mut f: Vec<(String, String)> =
                rt.block_on(redis::cmd("HGETALL").arg(&keys.window).query_async(conn)).unwrap();
            f.sort();
            f
        }
    }

    #[test]
    fn a_count_another_writer_left_unreadable_stops_no_call_half_way_and_is_dropped() {
        let Some(mut r) = OnRedis::start("a_count_another_writer_left_unreadable", 100) else { return };
        let b = r.bucket;
        let junks = ["twenty", "1.5", "-7", "1e400", "nan", "99999999999999999999"];
        for (k, junk) in junks.into_iter().enumerate() {
            let seq = 101 + 2 * k as u64;
            r.write(&(b - 1).to_string(), "0");
            r.write(&b.to_string(), "0");
            // A call counted admissions in two buckets and a grant; its reply was lost.
            assert_eq!(r.run(&r.call(seq, seq, 20, &[(b - 1, 3), (b, 5)])).granted, 20, "{junk:?}");
            // Then someone wrote over the current bucket's count.
            r.write(&b.to_string(), junk);
            // The next call undoes the lost one (its first bucket before it reaches the unreadable one) and
            // counts the admissions again: it runs to the end, counting the unreadable value as nothing.
            let reply = r.try_run(&r.call(seq + 1, seq, 0, &[(b - 1, 3), (b, 5)]));
            let reply = reply.unwrap_or_else(|e| panic!("{junk:?}: {e}"));
            assert!(!reply.late, "{junk:?}");
            assert_eq!(reply.window, vec![(b - 1, 3), (b, 5)], "{junk:?}: each admission once, nothing else");
            let buckets: Vec<_> = r.fields().into_iter().filter(|(k, _)| !k.contains(':') && k != "g").collect();
            assert_eq!(buckets, vec![((b - 1).to_string(), "3".into()), (b.to_string(), "5".into())], "{junk:?}");
        }
    }

    #[test]
    fn a_field_whose_name_only_reads_as_a_bucket_is_dropped_not_counted() {
        let Some(mut r) = OnRedis::start("a_field_whose_name_only_reads_as_a_bucket", 10) else { return };
        let b = r.bucket;
        for name in [format!("{b}.0"), format!(" {b}"), format!("0{b}"), format!("{b}e0")] {
            r.write(&name, "400");
        }
        let reply = r.run(&r.call(11, 11, 1_000, &[]));
        assert_eq!(reply.granted, 1_000, "the limit of 1000, nothing counted twice");
        let buckets: Vec<_> = r.fields().into_iter().filter(|(k, _)| !k.contains(':') && k != "g").collect();
        assert_eq!(buckets, vec![(b.to_string(), "1000".into())], "the others dropped");
    }

    #[test]
    fn a_count_that_is_not_a_number_cannot_open_the_window() {
        let Some(mut r) = OnRedis::start("a_count_that_is_not_a_number", 10) else { return };
        let b = r.bucket;
        assert_eq!(r.run(&r.call(11, 11, 600, &[])).granted, 600);
        for (i, junk) in ["nan", "-nan", "inf", "-inf", "-600", "abc"].into_iter().enumerate() {
            r.write(&(b - 1).to_string(), junk);
            let seq = 12 + i as u64;
            let reply = r.try_run(&r.call(seq, seq, 5_000, &[])).unwrap_or_else(|e| panic!("{junk:?}: {e}"));
            let expected = if i == 0 { 400 } else { 0 };
            assert_eq!(reply.granted, expected, "{junk:?}: the limit of 1000 holds");
            assert_eq!(r.total(), 1000, "{junk:?}: the unreadable count is dropped");
        }
    }

    #[test]
    fn a_key_of_another_type_is_refused_before_any_write() {
        let Some(mut r) = OnRedis::start("a_key_of_another_type_is_refused", 10) else { return };
        let OnRedis { rt, conn, keys, .. } = &mut r;
        let (window, members) = (keys.window.clone(), keys.members.clone());
        let _: () = rt.block_on(redis::cmd("DEL").arg(&window).query_async(conn)).unwrap();
        let _: () = rt.block_on(redis::cmd("SET").arg(&members).arg("someone else's").query_async(conn)).unwrap();
        let err = r.try_run(&r.call(11, 11, 5, &[(r.bucket, 2)])).unwrap_err();
        assert!(err.to_string().contains("WRONGTYPE"), "{err}");
        assert_eq!(r.fields(), vec![], "nothing written: no generation, no count");
    }

    #[test]
    fn a_count_at_the_top_that_admissions_push_past_it_does_not_open_the_window() {
        // 2^53 is a count the script reads (the window is full); the admissions it adds must not push it to
        // a value it reads as nothing (dropped by the sweep: the admissions go with it, the window opens).
        let Some(mut r) = OnRedis::start("a_count_at_the_top_that_admissions_push_past_it", 10) else { return };
        let b = r.bucket;
        r.write(&b.to_string(), "9007199254740992");
        let reply = r.run(&r.call(11, 11, 5_000, &[(b, 5)]));
        assert_eq!(reply.granted, 0, "a full window grants nothing: {reply:?}");
        let next = r.run(&r.call(12, 12, 5_000, &[]));
        assert_eq!(next.granted, 0, "the admissions counted stay counted: {next:?}");
    }

    #[test]
    fn two_leases_of_one_member_on_one_window_number_their_calls_in_records_of_their_own() {
        // Two rules of one instance with one flowId: each numbers its calls from Redis's clock when it starts.
        let Some(mut r) = OnRedis::start("two_leases_of_one_member_on_one_window", 100) else { return };
        assert_eq!(r.run(&r.call(101, 101, 5, &[])).granted, 5);
        // The other lease's call, numbered below the first's record: its own record, not a late call.
        let other = r.run(&LeaseCall { record: 1, ..r.call(60, 60, 5, &[]) });
        assert!(!other.late, "{other:?}");
        assert_eq!(other.granted, 5, "{other:?}");
        // Each record undoes only its own calls: the first lease's next call (its last seen) undoes nothing.
        let next = r.run(&r.call(102, 102, 0, &[]));
        assert_eq!(next.left, 1000 - 10, "{next:?}");
    }

    #[test]
    fn a_call_with_missing_arguments_is_refused_before_any_write() {
        let Some(mut r) = OnRedis::start("a_call_with_missing_arguments", 10) else { return };
        r.clear();
        // One batch of give-backs announced, none sent (nor the admissions' count).
        let res = r.eval(&["5", "me", "60000", "1000", "1", "3600000", "2", "0", "0", "11", "11", "1"]);
        assert!(res.is_err(), "{res:?}");
        assert_eq!(r.keys_existing(), 0, "nothing written: {:?}", r.fields());
    }

    #[test]
    fn an_infinite_allowance_or_an_empty_bucket_length_is_refused_before_any_write() {
        let Some(mut r) = OnRedis::start("an_infinite_allowance_or_an_empty_bucket", 10) else { return };
        r.clear();
        let good = ["5", "me", "60000", "1000", "1", "3600000", "2", "0", "0", "11", "11", "0", "0", "0"];
        for (i, bad) in [(3, "inf"), (3, "-inf"), (5, "0"), (6, "0"), (12, "nan"), (13, "-1"), (13, "0.5")] {
            let mut args = good;
            args[i] = bad;
            let res = r.eval(&args);
            assert!(res.is_err(), "ARGV[{}] = {bad}: {res:?}", i + 1);
        }
        assert_eq!(r.keys_existing(), 0, "nothing written");
        // The same call, well formed, runs.
        let res = r.eval(&good);
        assert!(res.is_ok(), "{res:?}");
    }

    #[test]
    fn a_long_reply_is_summed_per_bucket_in_one_pass() {
        // What a Redis that is not ours could send: many entries of few buckets (the check is quadratic no
        // more: 200,000 entries summed in one pass after a sort), with counts that would overflow a sum.
        let mut items = vec![5, 1_050, 10, 3, 95, 0, 0, 7];
        for i in 0..200_000i64 {
            items.extend([10 - i % 3, if i == 0 || i == 3 { i64::MAX } else { 1 }]);
        }
        let r = reply_of(&items).unwrap();
        assert_eq!(r.window, vec![(8, 66_666), (9, 66_667), (10, u64::MAX)]);
    }

    #[test]
    fn a_reply_of_the_wrong_shape_is_an_error_not_a_panic() {
        assert!(reply_of(&[5, 1_050, 10]).is_err());
        assert!(reply_of(&[5, 1_050, 10, 3, 95, 0, 0, 7, 8]).is_err(), "a bucket without its count");
    }
}
