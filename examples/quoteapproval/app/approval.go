package app

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	approvalv1 "github.com/protosaga/saga/examples/quoteapproval/approval/v1"
	"github.com/protosaga/saga/runtime/message"
)

// ErrAlreadyDecided is returned by Decide for a quote that has a decision.
var ErrAlreadyDecided = errors.New("the quote is already decided")

// Decision is a person's decision on a quote.
type Decision struct {
	QuoteID       string
	ApproverEmail string
	Approve       bool
	// Note is the approver's comment on an approval, the reason of a
	// rejection.
	Note string
}

// Decide records a person's decision on a quote and publishes it to the
// Quote Approval saga, ApprovalGranted or ApprovalRejected, in the caller's
// transaction: the decision and its event commit together, or neither does.
// A quote takes one decision (ErrAlreadyDecided). What the saga does with it
// depends on where the quote is when it arrives: a decision the saga no
// longer waits for goes to manual review (the step's late-reply policy).
func Decide(ctx context.Context, tx pgx.Tx, d Decision) (messageID string, err error) {
	if d.QuoteID == "" || d.ApproverEmail == "" || (!d.Approve && d.Note == "") {
		return "", fmt.Errorf("decide quote %q: a decision needs the quote, the approver and, to reject, a reason", d.QuoteID)
	}
	tag, err := tx.Exec(ctx, `INSERT INTO approval_decisions (quote_id, approved, approver_email, note)
VALUES ($1, $2, $3, $4) ON CONFLICT (quote_id) DO NOTHING`, d.QuoteID, d.Approve, d.ApproverEmail, d.Note)
	if err != nil {
		return "", fmt.Errorf("decide quote %s: record the decision: %w", d.QuoteID, err)
	}
	if tag.RowsAffected() == 0 {
		return "", fmt.Errorf("decide quote %s: %w", d.QuoteID, ErrAlreadyDecided)
	}
	effect := "rejected"
	if d.Approve {
		effect = "granted"
	}
	if err := journal(ctx, tx, d.QuoteID, "approval", effect, d.Note); err != nil {
		return "", err
	}
	if d.Approve {
		messageID, err = approvalv1.PublishApprovalGranted(ctx, tx,
			&approvalv1.ApprovalGranted{QuoteId: proto.String(d.QuoteID), ApproverEmail: proto.String(d.ApproverEmail), Comment: proto.String(d.Note)}, message.Meta{})
	} else {
		messageID, err = approvalv1.PublishApprovalRejected(ctx, tx,
			&approvalv1.ApprovalRejected{QuoteId: proto.String(d.QuoteID), ApproverEmail: proto.String(d.ApproverEmail), Reason: proto.String(d.Note)}, message.Meta{})
	}
	if err != nil {
		return "", fmt.Errorf("decide quote %s: publish the decision: %w", d.QuoteID, err)
	}
	return messageID, nil
}
