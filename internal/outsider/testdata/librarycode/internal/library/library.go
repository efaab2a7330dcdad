// Package library is the library's business code: the participants its
// contract names (catalog, billing, loan) and the Lend Book saga's decisions.
package library

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/protosaga/saga/runtime/host"
	"github.com/protosaga/saga/runtime/schema"

	billingv1 "example.com/library/gen/library/billing/v1"
	catalogv1 "example.com/library/gen/library/catalog/v1"
	loanv1 "example.com/library/gen/library/loan/v1"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS // your own tables

func Register(h *host.Host) error {
	ownTables, err := fs.Sub(migrationsFS, "migrations") // a source's .sql files are at its root
	if err != nil {
		return err
	}
	_, err = loanv1.RegisterLendBook(h, Decider{})
	return errors.Join(err,
		h.AddMigrations(schema.Source{Name: "library", FS: ownTables}),
		catalogv1.RegisterCatalogParticipant(h, Catalog{}),
		billingv1.RegisterBillingParticipant(h, Billing{}),
		loanv1.RegisterLoanParticipant(h, Loans{}),
	)
}

func record(ctx context.Context, tx pgx.Tx, loanID, effect string) error {
	_, err := tx.Exec(ctx, `INSERT INTO library_ledger (loan_id, effect) VALUES ($1, $2)`, loanID, effect)
	return err
}

// Catalog holds copies for loans and puts them back on the shelf.
type Catalog struct{}

func (Catalog) HoldCopy(ctx context.Context, tx pgx.Tx, cmd *catalogv1.HoldCopy) (catalogv1.HoldCopyResult, error) {
	var copyID string
	err := tx.QueryRow(ctx, `UPDATE library_copies SET held_by = $1 WHERE copy_id = (
  SELECT copy_id FROM library_copies WHERE isbn = $2 AND held_by IS NULL ORDER BY copy_id LIMIT 1 FOR UPDATE)
RETURNING copy_id`, cmd.GetLoanId(), cmd.GetIsbn()).Scan(&copyID)
	if errors.Is(err, pgx.ErrNoRows) {
		return &catalogv1.NoCopyAvailable{LoanId: cmd.GetLoanId()}, record(ctx, tx, cmd.GetLoanId(), "no_copy")
	}
	if err != nil {
		return nil, fmt.Errorf("hold a copy of %s: %w", cmd.GetIsbn(), err)
	}
	return &catalogv1.CopyHeld{LoanId: cmd.GetLoanId(), CopyId: copyID}, record(ctx, tx, cmd.GetLoanId(), "held")
}

func (Catalog) ReturnCopyToShelf(ctx context.Context, tx pgx.Tx, cmd *catalogv1.ReturnCopyToShelf) (catalogv1.ReturnCopyToShelfResult, error) {
	if _, err := tx.Exec(ctx, `UPDATE library_copies SET held_by = NULL WHERE held_by = $1`, cmd.GetLoanId()); err != nil {
		return nil, fmt.Errorf("return the copy of loan %s: %w", cmd.GetLoanId(), err)
	}
	return &catalogv1.CopyReturnedToShelf{LoanId: cmd.GetLoanId()}, record(ctx, tx, cmd.GetLoanId(), "returned")
}

// Billing charges deposits; members whose id starts with "blocked-" are
// declined.
type Billing struct{}

func (Billing) ChargeDeposit(ctx context.Context, tx pgx.Tx, cmd *billingv1.ChargeDeposit) (billingv1.ChargeDepositResult, error) {
	if strings.HasPrefix(cmd.GetMemberId(), "blocked-") {
		return &billingv1.DepositDeclined{LoanId: cmd.GetLoanId(), Reason: "member blocked"}, record(ctx, tx, cmd.GetLoanId(), "declined")
	}
	return &billingv1.DepositCharged{LoanId: cmd.GetLoanId()}, record(ctx, tx, cmd.GetLoanId(), "charged")
}

// Loans opens loans.
type Loans struct{}

func (Loans) OpenLoan(ctx context.Context, tx pgx.Tx, cmd *loanv1.OpenLoan) (loanv1.OpenLoanResult, error) {
	return &loanv1.LoanOpened{LoanId: cmd.GetLoanId()}, record(ctx, tx, cmd.GetLoanId(), "opened "+cmd.GetCopyId())
}

// Decider makes the Lend Book saga's business decisions.
type Decider struct{ loanv1.LendBookNoopFolds }

func (Decider) Start(_ context.Context, req *loanv1.LendBookRequest) (*loanv1.LendBookData, error) {
	if req.GetLoanId() == "" || req.GetIsbn() == "" {
		return nil, errors.New("a loan needs a loan id and an ISBN")
	}
	return &loanv1.LendBookData{LoanId: req.GetLoanId(), MemberId: req.GetMemberId(), Isbn: req.GetIsbn(), DepositCents: 500}, nil
}

func (Decider) BuildHoldCopy(_ context.Context, d *loanv1.LendBookData) (*catalogv1.HoldCopy, error) {
	return &catalogv1.HoldCopy{LoanId: d.GetLoanId(), Isbn: d.GetIsbn()}, nil
}

func (Decider) BuildReturnCopyToShelf(_ context.Context, d *loanv1.LendBookData) (*catalogv1.ReturnCopyToShelf, error) {
	return &catalogv1.ReturnCopyToShelf{LoanId: d.GetLoanId()}, nil
}

func (Decider) BuildChargeDeposit(_ context.Context, d *loanv1.LendBookData) (*billingv1.ChargeDeposit, error) {
	return &billingv1.ChargeDeposit{LoanId: d.GetLoanId(), MemberId: d.GetMemberId(), DepositCents: d.GetDepositCents()}, nil
}

func (Decider) BuildOpenLoan(_ context.Context, d *loanv1.LendBookData) (*loanv1.OpenLoan, error) {
	return &loanv1.OpenLoan{LoanId: d.GetLoanId(), CopyId: d.GetCopyId()}, nil
}

func (Decider) OnCopyHeld(_ context.Context, d *loanv1.LendBookData, m *catalogv1.CopyHeld) error {
	d.CopyId = m.GetCopyId()
	return nil
}

func (Decider) OnDepositDeclined(_ context.Context, d *loanv1.LendBookData, m *billingv1.DepositDeclined) error {
	d.DeclineReason = m.GetReason()
	return nil
}
