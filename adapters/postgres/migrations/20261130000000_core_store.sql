-- The standard's store tables: `core.processed_jobs` (claimed in every work transaction) and
-- `core.dead_letters` (recorded by the runtime, reviewed by operators). Written with
-- `if not exists` so that the schema may also be created by hand before sqlx tracks it.

create schema if not exists core;

create table if not exists core.processed_jobs (
    job_id       uuid        not null,
    consumer     text        not null,
    processed_at timestamptz not null,
    primary key (job_id, consumer)
);

-- The TTL purge selects by age.
create index if not exists processed_jobs_processed_at on core.processed_jobs (processed_at);

create table if not exists core.dead_letters (
    id             bigint generated always as identity primary key,
    job_id         uuid        null,
    queue          text        not null,
    tenant_id      uuid        null,
    kind           text        null,
    correlation_id uuid        null,
    payload        bytea       not null,
    attempts       integer     not null check (attempts >= 0),
    last_error     text        not null,
    dedup_key      text        null,
    status         text        not null default 'pending_review'
                   check (status in ('pending_review', 'replayed', 'discarded')),
    created_at     timestamptz not null,
    updated_at     timestamptz not null
);

-- Listing: by status, by queue, by tenant, each in id order for keyset pagination.
create index if not exists dead_letters_status_id on core.dead_letters (status, id);
create index if not exists dead_letters_queue_status_id on core.dead_letters (queue, status, id);
create index if not exists dead_letters_tenant_status_id
    on core.dead_letters (tenant_id, status, id);

-- At most one pending letter per queue and dedup key: a message dead-lettered but not acked
-- comes back and must not become a second pending letter.
create unique index if not exists dead_letters_pending_dedup
    on core.dead_letters (queue, dedup_key)
    where status = 'pending_review' and dedup_key is not null;
