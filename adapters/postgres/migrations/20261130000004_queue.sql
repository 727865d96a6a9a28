-- The PostgreSQL queue (ADR 0011): `core.jobs`, one row per job not yet done (deleted on ack),
-- and `core.outbox`, jobs published in an application's transaction for a relay to forward to
-- another transport. Times are the adapter's clock, passed in, never `now()`.

create schema if not exists core;

create table if not exists core.jobs (
    id         bigint generated always as identity primary key,
    queue      text        not null,
    -- The publish's key (the job id unless set): unique while the job is pending.
    dedup_key  text        not null,
    payload    bytea       not null,
    tenant_id  uuid        null,
    -- When the row is deliverable: its run_at, its retry or deferral time, or its lease's end.
    visible_at timestamptz not null,
    -- Deliveries so far: the attempt number of the latest one (a deferral gives one back).
    deliveries integer     not null default 0 check (deliveries >= 0),
    -- The fencing token: bumped by every delivery, so a stale lease cannot settle the job.
    lease_gen  bigint      not null default 0,
    leased     boolean     not null default false,
    created_at timestamptz not null,
    -- Rows exist only until the ack, so this is "unique among not-yet-done jobs".
    constraint jobs_dedup unique (queue, dedup_key)
) with (
    -- Delete on ack makes the table churn: vacuum every few thousand dead rows whatever its
    -- size, without throttling, so the fetch's index scans stay short.
    fillfactor = 90,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.02
);

-- The fetch order: ready rows are the prefix `visible_at <= now` of each queue.
create index if not exists jobs_ready on core.jobs (queue, visible_at, id);

-- Wake-ups: one notification per queue per inserting statement, delivered at commit.
create or replace function core.jobs_notify() returns trigger
language plpgsql as $$
begin
    perform pg_notify('core_jobs', q.queue) from (select distinct queue from inserted) as q;
    return null;
end;
$$;

drop trigger if exists jobs_notify on core.jobs;
create trigger jobs_notify after insert on core.jobs
    referencing new table as inserted
    for each statement execute function core.jobs_notify();

create table if not exists core.outbox (
    id         bigint generated always as identity primary key,
    queue      text        not null,
    dedup_key  text        not null,
    tenant_id  uuid        null,
    payload    bytea       not null,
    run_at     timestamptz not null,
    created_at timestamptz not null
) with (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0
);
