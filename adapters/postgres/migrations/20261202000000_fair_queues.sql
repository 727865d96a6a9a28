-- Fair dequeue across tenants (ADR 0013). A queue listed in `core.fair_queues` is fetched by
-- `core.lease_fair`: deficit round-robin over its tenants' lanes, at most `tenant_limit` jobs
-- of one tenant in flight. Its rows carry `lane` (the tenant, the nil UUID for a row without
-- one), set at insert; the rows of every other queue have no lane. Each row is in exactly one
-- of the two fetch indexes, so a fair queue's publish costs what a FIFO queue's does.

create table if not exists core.fair_queues (
    queue        text collate "C" primary key,
    -- At most this many jobs of one tenant leased at once; no limit when null.
    tenant_limit integer null check (tenant_limit > 0)
);

-- A tenant's turns per round on a fair queue; 1 when absent.
create table if not exists core.tenant_weights (
    queue     text collate "C" not null,
    tenant_id uuid not null,
    weight    integer not null check (weight > 0),
    primary key (queue, tenant_id)
);

alter table core.jobs add column if not exists lane uuid null;

-- The FIFO fetch's index covers the rows without a lane; the fair fetch's, those with one.
drop index if exists core.jobs_ready;
create index jobs_ready on core.jobs (queue, visible_at, id) where lane is null;
create index if not exists jobs_lanes on core.jobs (queue, lane, visible_at, id)
    where lane is not null;

-- Leases up to `p_max` ready jobs of the fair queue `p_queue` at `p_now` until `p_until`, in
-- one committed call, as the FIFO lease statement does (a new fencing generation, one
-- delivery more, `synchronous_commit` off for the lease alone).
--
-- The lanes with ready jobs are visited in lane order from the cursor (`p_after`, and
-- `p_left` turns left of its lane's turn), wrapping around, at most `p_max` of them; a lane
-- at its tenant limit is passed over. The limit is counted under a transaction-level
-- advisory lock per lane, taken with try (a lane another fetch is leasing from is passed over,
-- never waited for); each statement of this volatile function reads a fresh snapshot, so the
-- count sees every lease committed before the lock was granted. From each lane it takes
-- candidates (locked, skipping rows other fetches hold) and serves them by rounds: the k-th
-- candidate of a lane of weight w goes in round ceil(k / w), rounds in order, lanes in visit
-- order within a round; the first lane's carried turn is round 0, and its later turns come
-- last in their rounds. It answers the leased rows in that order (`ord`), each with the
-- cursor for the next call.
create or replace function core.lease_fair(
    p_queue text, p_now timestamptz, p_until timestamptz, p_max integer,
    p_after uuid, p_left integer)
returns table (
    id bigint, payload bytea, deliveries integer, lease_gen bigint, visible_at timestamptz,
    expired boolean, ord integer, cursor_lane uuid, cursor_left integer)
language plpgsql volatile as $$
#variable_conflict use_column
declare
    nil constant uuid := '00000000-0000-0000-0000-000000000000';
    v_limit integer;
    -- The lanes to serve, in visit order, with room (jobs they may still lease: unbounded
    -- without a limit) and weight.
    v_lanes uuid[] := '{}';
    v_rooms integer[] := '{}';
    v_weights integer[] := '{}';
    v_carry integer := 0;
    v_at uuid := coalesce(p_after, nil);
    -- The visit starts at the cursor's lane when its turn goes on, else after it.
    v_from_cursor constant boolean := coalesce(p_left, 0) > 0;
    v_inclusive boolean := p_after is null or v_from_cursor;
    v_wrapped boolean := false;
    v_next uuid;
    v_weight integer;
    v_room integer;
    v_total_weight integer;
    v_n integer;
    -- Candidates: lane position, row, whether it was leased, rank in its lane.
    v_asked integer[] := '{}';
    v_pos integer[];
    v_ids bigint[];
    v_leased boolean[];
    v_ks integer[];
    v_got integer;
    v_count integer;
    v_more integer;
    v_more_ids bigint[];
    v_more_leased boolean[];
begin
    perform set_config('synchronous_commit', 'off', true);
    select f.tenant_limit into v_limit from core.fair_queues f where f.queue = p_queue;
    if p_max <= 0 then
        return;
    end if;
    -- A row inserted without its lane (by a transaction whose snapshot predates the queue's
    -- listing) gets it now, unless a worker holds it.
    -- (Each probe is written as an ordered scan of one row, so that the plan walks the index
    -- whatever the statistics say.)
    perform 1 from core.jobs s where s.queue = p_queue and s.lane is null
        order by s.visible_at, s.id limit 1;
    if found then
        update core.jobs s set lane = coalesce(s.tenant_id, nil)
        where s.id in (select u.id from core.jobs u
                       where u.queue = p_queue and u.lane is null for update skip locked);
    end if;
    loop
        exit when coalesce(array_length(v_lanes, 1), 0) >= p_max;
        -- Two statements, so that each bound is an index condition.
        if v_inclusive then
            select l.lane into v_next from core.jobs l
            where l.queue = p_queue and l.lane >= v_at order by l.lane limit 1;
        else
            select l.lane into v_next from core.jobs l
            where l.queue = p_queue and l.lane > v_at order by l.lane limit 1;
        end if;
        v_inclusive := false;
        if v_next is null then
            -- From the first lane on, around to the cursor's.
            exit when v_wrapped or p_after is null;
            v_wrapped := true;
            v_at := nil;
            v_inclusive := true;
            continue;
        end if;
        exit when v_wrapped and (v_next > p_after or (v_from_cursor and v_next = p_after));
        v_at := v_next;
        v_next := null;
        perform 1 from core.jobs r
            where r.queue = p_queue and r.lane = v_at and r.visible_at <= p_now
            order by r.visible_at, r.id limit 1;
        continue when not found;
        v_room := 2147483647;
        if v_limit is not null then
            continue when not pg_try_advisory_xact_lock(
                hashtextextended(p_queue || '/' || v_at::text, 0));
            select v_limit - count(*) into v_room from core.jobs b
            where b.queue = p_queue and b.lane = v_at and b.leased and b.visible_at > p_now;
            continue when v_room <= 0;
        end if;
        select coalesce((select w.weight from core.tenant_weights w
                         where w.queue = p_queue and w.tenant_id = v_at), 1)
          into v_weight;
        if v_at = p_after and coalesce(array_length(v_lanes, 1), 0) = 0 then
            v_carry := least(greatest(coalesce(p_left, 0), 0), v_weight);
        end if;
        v_lanes := v_lanes || v_at;
        v_rooms := v_rooms || v_room;
        v_weights := v_weights || v_weight;
    end loop;
    v_n := coalesce(array_length(v_lanes, 1), 0);
    if v_n = 0 then
        return;
    end if;
    -- What each lane's rounds can take if every lane has enough: its share of the batch, and a
    -- turn more for the rounding and the carried turn; never more than its room.
    select sum(w) into v_total_weight from unnest(v_weights) as w;
    for i in 1 .. v_n loop
        v_asked := v_asked || least(v_rooms[i],
            ceil(p_max::numeric * v_weights[i] / v_total_weight)::integer + 2 * v_weights[i]);
    end loop;
    select coalesce(array_agg(c.pos order by c.pos, c.k), '{}'),
           coalesce(array_agg(c.id order by c.pos, c.k), '{}'),
           coalesce(array_agg(c.leased order by c.pos, c.k), '{}'),
           coalesce(array_agg(c.k order by c.pos, c.k), '{}')
      into v_pos, v_ids, v_leased, v_ks
    from (select l.pos::integer as pos, j.id, j.leased,
                 (row_number() over (partition by l.pos order by j.visible_at, j.id))::integer as k
          from unnest(v_lanes, v_asked) with ordinality as l(lane, asked, pos)
          cross join lateral (
              select r.id, r.leased, r.visible_at from core.jobs r
              where r.queue = p_queue and r.lane = l.lane and r.visible_at <= p_now
              order by r.visible_at, r.id limit l.asked
              for update skip locked) j) c;
    -- Lanes short of rows leave the batch short: the lanes that gave all they were asked for
    -- are asked for the rest, in visit order, after the rows they gave.
    v_got := coalesce(array_length(v_ids, 1), 0);
    for i in 1 .. v_n loop
        exit when v_got >= p_max;
        select count(*)::integer into v_count from unnest(v_pos) as p where p = i;
        continue when v_count < v_asked[i] or v_rooms[i] <= v_count;
        v_more := least(v_rooms[i] - v_count, p_max - v_got);
        select coalesce(array_agg(r.id order by r.visible_at, r.id), '{}'),
               coalesce(array_agg(r.leased order by r.visible_at, r.id), '{}')
          into v_more_ids, v_more_leased
        from (select m.id, m.leased, m.visible_at from core.jobs m
              where m.queue = p_queue and m.lane = v_lanes[i] and m.visible_at <= p_now
                and m.id <> all (v_ids)
              order by m.visible_at, m.id limit v_more
              for update skip locked) r;
        for j in 1 .. coalesce(array_length(v_more_ids, 1), 0) loop
            v_pos := v_pos || i;
            v_ids := v_ids || v_more_ids[j];
            v_leased := v_leased || v_more_leased[j];
            v_ks := v_ks || (v_count + j);
        end loop;
        v_asked[i] := v_asked[i] + v_more;
        v_got := coalesce(array_length(v_ids, 1), 0);
    end loop;
    return query
    with lanes as (
        select l.pos::integer as pos, l.lane, l.room, l.asked
        from unnest(v_lanes, v_rooms, v_asked) with ordinality as l(lane, room, asked, pos)),
    candidates as (
        select c.pos, c.id, c.leased, c.k, v_weights[c.pos] as weight
        from unnest(v_pos, v_ids, v_leased, v_ks) as c(pos, id, leased, k)),
    rounds as (
        select c.*,
               case when c.pos = 1 and c.k <= v_carry then 0
                    else ceil((c.k - case when c.pos = 1 then v_carry else 0 end)::numeric
                              / c.weight)::integer end as round
        from candidates c),
    -- A lane that finished its carried turn in round 0 has its next turns after every other
    -- lane's in each round, as the rotation goes on past it.
    turns as (
        select r.*,
               case when r.pos = 1 and v_carry > 0 and r.round > 0 then v_n + 1
                    else r.pos end as place
        from rounds r),
    chosen as (
        select t.*, row_number() over (order by t.round, t.place, t.k)::integer as ord
        from turns t order by t.round, t.place, t.k limit p_max),
    final_pick as (
        select ch.pos, ch.k, ch.round, ch.weight from chosen ch order by ch.ord desc limit 1),
    -- The lane served last, and what is left of its turn when it has more to give: rows it
    -- gave that were not chosen, or all it was asked for (it may have more).
    next_turn as (
        select lanes.lane,
               case when f.k < lanes.room
                         and (exists (select 1 from candidates c
                                      where c.pos = f.pos and c.k > f.k)
                              or f.k >= lanes.asked)
                    then case when f.round = 0 then v_carry - f.k
                              else f.weight * f.round
                                   + case when f.pos = 1 then v_carry else 0 end
                                   - f.k end
                    else 0 end as left_over
        from final_pick f join lanes on lanes.pos = f.pos),
    leased as (
        update core.jobs j set leased = true, visible_at = p_until,
            deliveries = j.deliveries + 1, lease_gen = j.lease_gen + 1
        from chosen ch
        where j.id = ch.id
        returning j.id, j.payload, j.deliveries, j.lease_gen, j.visible_at, ch.leased, ch.ord)
    select l.id, l.payload, l.deliveries, l.lease_gen, l.visible_at, l.leased, l.ord,
           next_turn.lane, next_turn.left_over
    from leased l cross join next_turn;
end;
$$;
