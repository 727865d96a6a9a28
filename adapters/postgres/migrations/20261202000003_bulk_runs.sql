-- Bulk dead-letter runs (`jobsctl dead-letters replay|discard --all`, the console's bulk
-- actions), journaled in the store so that every console instance and every `jobsctl` see the
-- same runs, their progress, and resume the same unfinished one. A run is the snapshot of the
-- ids it acts on, in order (`ids`), and one item per letter settled, recorded once.
--
-- At most one unfinished run per key (the action and the filter, as the caller describes
-- them): two operators starting the same run at once insert `on conflict do nothing` against
-- the partial unique index, and both then read the one run. Neither table references
-- `core.dead_letters`: a run's record outlives the letters it names, and a `truncate` of the
-- dead letters need not name these tables.
create table if not exists core.bulk_runs (
    id          bigint generated always as identity primary key,
    key         text        not null,
    action      text        not null check (action in ('replay', 'discard')),
    ids         bigint[]    not null,
    "by"        text        not null,
    started_at  timestamptz not null,
    finished_at timestamptz null
);

create unique index if not exists bulk_runs_unfinished_key
    on core.bulk_runs (key) where finished_at is null;

create table if not exists core.bulk_run_items (
    run_id    bigint not null references core.bulk_runs (id) on delete cascade,
    letter_id bigint not null,
    outcome   text   not null,
    primary key (run_id, letter_id)
);
