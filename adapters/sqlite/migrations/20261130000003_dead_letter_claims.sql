-- A dead letter is recorded in a work transaction that holds the job's claim in
-- `processed_jobs`, so a job is never both committed and pending review. The letter keeps the
-- consumer whose claim it is: replaying it releases that claim.
alter table dead_letters add column consumer text null;

-- The claim asks whether a settled job is waiting for review.
create index if not exists dead_letters_pending_job
    on dead_letters (job_id, consumer)
    where status = 'pending_review';

-- Superseded: claims no longer look letters up by dedup key alone.
drop index if exists dead_letters_pending_key;
