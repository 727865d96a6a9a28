-- The fair fetch read from a low-water mark per lane (ADR 0015). `core.lease_fair` (ADR 0013)
-- reads each lane of the fair index `jobs_lanes (queue, lane, visible_at, id)` from its start,
-- so while a snapshot older than the jobs done since is held elsewhere, every probe walks the
-- dead entries those jobs left. `core.lease_fair_marked` is the same fetch (the same rounds,
-- weights, cursor, tenant limit and locks) with two more arguments: the lanes the caller knows
-- (`p_lanes`, ascending, no duplicates) and, for each, where to read it from (`p_marks`; null
-- reads the lane from its start, a sweep). Between two known lanes it looks for lanes it does
-- not know with a probe bounded by the next known lane, so a new lane is found as soon as
-- before, and only a lane the caller forgot makes a probe walk its dead entries.
--
-- Besides the leased rows it answers one row per lane whose candidates it looked for (`id`
-- null): the lane and the earliest `visible_at` among its candidates, or null when the lane
-- had no ready row at or above its mark. The caller's next mark for that lane is that time,
-- or its "now" less a grace when that is earlier (adapters/postgres/src/mark.rs).
--
-- `core.lease_fair` stays for workers of the previous version during a rolling deploy: both
-- lease the same rows with the same fencing, so they can run side by side.
create or replace function core.lease_fair_marked(
    p_queue text, p_now timestamptz, p_until timestamptz, p_max integer,
    p_after uuid, p_left integer, p_lanes uuid[], p_marks timestamptz[])
returns table (
    id bigint, payload bytea, deliveries integer, lease_gen bigint, visible_at timestamptz,
    expired boolean, ord integer, cursor_lane uuid, cursor_left integer,
    mark_lane uuid, mark_first timestamptz)
language plpgsql volatile as $$
#variable_conflict use_column
declare
    nil constant uuid := '00000000-0000-0000-0000-000000000000';
    v_limit integer;
    -- The known lanes, ascending, their marks, and the next one to pass in the visit.
    v_known uuid[] := coalesce(p_lanes, '{}');
    v_known_marks timestamptz[] := coalesce(p_marks, '{}');
    v_known_n constant integer := coalesce(array_length(p_lanes, 1), 0);
    v_k integer := 1;
    v_bound uuid;
    v_mark timestamptz;
    -- The lanes to serve, in visit order, with room (jobs they may still lease: unbounded
    -- without a limit), weight and mark.
    v_lanes uuid[] := '{}';
    v_rooms integer[] := '{}';
    v_weights integer[] := '{}';
    v_marks timestamptz[] := '{}';
    -- The lanes visited that had no ready row at or above their mark.
    v_empty uuid[] := '{}';
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
    -- Candidates: lane position, row, whether it was leased, rank in its lane, visible_at.
    v_asked integer[] := '{}';
    v_pos integer[];
    v_ids bigint[];
    v_leased boolean[];
    v_ks integer[];
    v_seen timestamptz[];
    v_got integer;
    v_count integer;
    v_more integer;
    v_more_ids bigint[];
    v_more_leased boolean[];
    v_more_seen timestamptz[];
begin
    perform set_config('synchronous_commit', 'off', true);
    if coalesce(array_length(p_marks, 1), 0) <> v_known_n then
        raise exception 'core.lease_fair_marked: % lanes but % marks',
            v_known_n, coalesce(array_length(p_marks, 1), 0);
    end if;
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
        -- The first known lane the visit has not passed: the probe for lanes nobody knows
        -- stops there, so it never walks a known lane's entries.
        while v_k <= v_known_n
              and (v_known[v_k] < v_at or (v_known[v_k] = v_at and not v_inclusive)) loop
            v_k := v_k + 1;
        end loop;
        v_bound := case when v_k <= v_known_n then v_known[v_k] end;
        -- One statement per shape of the bounds, so that each bound is an index condition
        -- (an `or` with a null test would make the upper one a filter, read after the scan
        -- has walked the known lane's entries).
        if v_bound is null and v_inclusive then
            select l.lane into v_next from core.jobs l
            where l.queue = p_queue and l.lane >= v_at order by l.lane limit 1;
        elsif v_bound is null then
            select l.lane into v_next from core.jobs l
            where l.queue = p_queue and l.lane > v_at order by l.lane limit 1;
        elsif v_inclusive then
            select l.lane into v_next from core.jobs l
            where l.queue = p_queue and l.lane >= v_at and l.lane < v_bound
            order by l.lane limit 1;
        else
            select l.lane into v_next from core.jobs l
            where l.queue = p_queue and l.lane > v_at and l.lane < v_bound
            order by l.lane limit 1;
        end if;
        if v_next is not null then
            -- A lane nobody knows: read from its start.
            v_mark := null;
        elsif v_bound is not null then
            v_next := v_bound;
            v_mark := v_known_marks[v_k];
        end if;
        v_inclusive := false;
        if v_next is null then
            -- From the first lane on, around to the cursor's.
            exit when v_wrapped or p_after is null;
            v_wrapped := true;
            v_at := nil;
            v_inclusive := true;
            v_k := 1;
            continue;
        end if;
        exit when v_wrapped and (v_next > p_after or (v_from_cursor and v_next = p_after));
        v_at := v_next;
        v_next := null;
        perform 1 from core.jobs r
            where r.queue = p_queue and r.lane = v_at
              and r.visible_at >= coalesce(v_mark, '-infinity') and r.visible_at <= p_now
            order by r.visible_at, r.id limit 1;
        if not found then
            v_empty := v_empty || v_at;
            continue;
        end if;
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
        v_marks := v_marks || v_mark;
    end loop;
    -- The lanes found without a ready row: their marks may move up to the caller's "now".
    return query select null::bigint, null::bytea, null::integer, null::bigint,
        null::timestamptz, null::boolean, null::integer, null::uuid, null::integer,
        e.lane, null::timestamptz
        from unnest(v_empty) as e(lane);
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
           coalesce(array_agg(c.k order by c.pos, c.k), '{}'),
           coalesce(array_agg(c.seen order by c.pos, c.k), '{}')
      into v_pos, v_ids, v_leased, v_ks, v_seen
    from (select l.pos::integer as pos, j.id, j.leased, j.visible_at as seen,
                 (row_number() over (partition by l.pos order by j.visible_at, j.id))::integer as k
          from unnest(v_lanes, v_asked, v_marks) with ordinality as l(lane, asked, mark, pos)
          cross join lateral (
              select r.id, r.leased, r.visible_at from core.jobs r
              where r.queue = p_queue and r.lane = l.lane
                and r.visible_at >= coalesce(l.mark, '-infinity') and r.visible_at <= p_now
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
               coalesce(array_agg(r.leased order by r.visible_at, r.id), '{}'),
               coalesce(array_agg(r.visible_at order by r.visible_at, r.id), '{}')
          into v_more_ids, v_more_leased, v_more_seen
        from (select m.id, m.leased, m.visible_at from core.jobs m
              where m.queue = p_queue and m.lane = v_lanes[i]
                and m.visible_at >= coalesce(v_marks[i], '-infinity') and m.visible_at <= p_now
                and m.id <> all (v_ids)
              order by m.visible_at, m.id limit v_more
              for update skip locked) r;
        for j in 1 .. coalesce(array_length(v_more_ids, 1), 0) loop
            v_pos := v_pos || i;
            v_ids := v_ids || v_more_ids[j];
            v_leased := v_leased || v_more_leased[j];
            v_ks := v_ks || (v_count + j);
            v_seen := v_seen || v_more_seen[j];
        end loop;
        v_asked[i] := v_asked[i] + v_more;
        v_got := coalesce(array_length(v_ids, 1), 0);
    end loop;
    -- Each served lane's earliest candidate (none when every ready row was locked by another
    -- fetch): what the caller's next fetch of it may read from.
    return query select null::bigint, null::bytea, null::integer, null::bigint,
        null::timestamptz, null::boolean, null::integer, null::uuid, null::integer,
        l.lane, (select min(s.seen) from unnest(v_pos, v_seen) as s(pos, seen)
                 where s.pos = l.pos)
        from unnest(v_lanes) with ordinality as l(lane, pos);
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
           next_turn.lane, next_turn.left_over, null::uuid, null::timestamptz
    from leased l cross join next_turn;
end;
$$;
